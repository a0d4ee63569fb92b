"""What an ``s3://`` level's credentials cost its first request (issue 61), in fresh processes:
``s3.keys`` (the package's own resolution: the environment's keys read with nothing imported, or
botocore's session) for keys in the environment, a profile's keys in ``~/.aws``, and a
``credential_process`` profile; split into botocore's import, its session and the credentials, with
the memory it adds.

    python benchmarks/credentials.py [--runs 9]

Prints a Markdown table (medians, and their ranges). Nothing is fetched from a network: the
credential process is this interpreter printing keys.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, os, sys, time
peak = lambda: next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) * 1024
before = peak()
t0 = time.perf_counter()
from gkx_autocache._backends import s3
t1 = time.perf_counter()
found = s3.keys(os.environ, "bench")
t2 = time.perf_counter()
assert not isinstance(found, str), found
found.frozen()
t3 = time.perf_counter()
print(json.dumps({"module": t1 - t0, "keys": t2 - t1, "first_frozen": t3 - t2, "botocore": "botocore" in sys.modules,
                  "rss_added": peak() - before}))
"""

PARTS = r"""
import json, os, time
t0 = time.perf_counter()
import botocore.session
t1 = time.perf_counter()
session = botocore.session.Session()
session.get_scoped_config()
t2 = time.perf_counter()
session.get_credentials().get_frozen_credentials()
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "session": t2 - t1, "credentials": t3 - t2}))
"""


def run(code: str, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    found: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args(argv)
    import os

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "keys.py").write_text('print(\'{"Version": 1, "AccessKeyId": "AKID", "SecretAccessKey": "s"}\')\n')
        (folder / "config").write_text(f"[profile proc]\ncredential_process = {sys.executable} {folder / 'keys.py'}\n"
                                       "[profile keys]\nregion = eu-west-1\n")
        (folder / "credentials").write_text("[keys]\naws_access_key_id = AKID\naws_secret_access_key = s\n")
        base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and not k.endswith(("_proxy", "_PROXY"))}
        base.update(AWS_EC2_METADATA_DISABLED="true", AWS_DEFAULT_REGION="us-east-1", HOME=str(folder))
        cases = {
            "keys in the environment (no ~/.aws/config)": {**base, "AWS_ACCESS_KEY_ID": "AKID",
                                                           "AWS_SECRET_ACCESS_KEY": "s", "AWS_CONFIG_FILE": "/nonexistent"},
            "a profile's keys in ~/.aws": {**base, "AWS_PROFILE": "keys", "AWS_CONFIG_FILE": str(folder / "config"),
                                           "AWS_SHARED_CREDENTIALS_FILE": str(folder / "credentials")},
            "a credential_process profile": {**base, "AWS_PROFILE": "proc", "AWS_CONFIG_FILE": str(folder / "config"),
                                             "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"},
        }
        rows = [f"| credentials (fresh processes, median of {args.runs}; range) | s3.keys, at the first request | of "
                "which botocore's import | its session | the credentials | first signing (frozen) | memory added |",
                "|---|---|---|---|---|---|---|"]
        for name, env in cases.items():
            ours = [run(CHILD, env) for _ in range(args.runs)]
            parts = [run(PARTS, env) for _ in range(args.runs)] if ours[0]["botocore"] else []

            def med(items: list[dict[str, float]], field: str) -> str:
                values = [item[field] for item in items]
                return f"{statistics.median(values) * 1000:.0f} ms ({min(values) * 1000:.0f}-{max(values) * 1000:.0f})"

            split = [med(parts, f) for f in ("import", "session", "credentials")] if parts else ["none imported", "", ""]
            rss = statistics.median(item["rss_added"] for item in ours) / (1 << 20)
            rows.append(f"| {name} | {med(ours, 'keys')} | {' | '.join(split)} | {med(ours, 'first_frozen')} | "
                        f"{rss:+.0f} MiB |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
