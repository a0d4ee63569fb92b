"""The levels' fixed costs alone, in a few minutes: two figures of a short program (``SHORT`` in
run.py, 62 entries, a warm run of about 2.2 s on 2 cores), as alternated pairs of fresh processes.

    python benchmarks/pairs_levels.py [--pairs 5] [--delay 0.02] [--http | --azure] [--proxy] [--credential-process]
                                      [--only a a_slow b] [--rev REV | --python PATH] [--json OUT]

  (a) a writer's warm run (every lookup a local hit) with ``GKX_JAX_CACHE_SHARED=s3://…`` set
      (``shared_write`` at its default, ``always``) against the same warm run with no shared level;
      once against moto directly, once with every request delayed (target: 1.02);
  (b) a fresh machine (an empty local level; the bucket filled by an earlier writer's run, with its
      manifest and pack) against a local warm run with the same shared level set, every request
      delayed (target: 1.15).

``--proxy``: every request of the levels through a real forward proxy (tinyproxy, named by
``HTTP_PROXY``) in front of the delaying one; ``--credential-process``: the bucket's keys from a
``credential_process`` profile, none in the environment (issue 61).
``--http``: the same figures with an HTTP cache (nginx with WebDAV, ``tests/webdav.py``) in place
of the bucket; ``--azure``: with an Azure container (Azurite, ``tests/blobs.py``, Shared Key from a connection
string). moto's S3 server (or nginx, or Azurite) and a delaying proxy (``tests/hostile.py``) run once, on 127.0.0.1; the wheel is
built from the working tree into a throwaway venv that sees this interpreter's packages (JAX,
s3fs), as ``run.py --only levels`` does; ``--rev`` builds it from a commit instead (``git archive``:
a baseline while the working tree changes; the benchmark's own code stays the working tree's), and
``--python`` names an interpreter that has the package already (an editable install: the working
tree as it is, without a build). Prints a
Markdown table; ``--json`` writes every run's figures. The full suite measures the same figures
(9 pairs) in its ``levels`` section.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5, help="alternated pairs per figure (default 5)")
    parser.add_argument("--delay", type=float, default=0.02, help="seconds added to each request (default 0.02)")
    parser.add_argument("--rev", help="build the package from this commit (git archive), not the working tree")
    parser.add_argument("--python", help="an interpreter with the package and the remote extra installed (no build)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--http", action="store_true", help="an HTTP cache (nginx with WebDAV) in place of the bucket")
    parser.add_argument("--azure", action="store_true", help="an Azure container (Azurite) in place of the bucket")
    parser.add_argument("--proxy", action="store_true", help="every request through a forward proxy (tinyproxy)")
    parser.add_argument("--credential-process", action="store_true", help="the keys from a credential_process profile")
    parser.add_argument("--only", nargs="+", choices=("a", "a_slow", "b"), default=(), help="only these figures")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gkx-pairs-") as tmp:
        work = Path(tmp)
        if args.python:
            python = Path(args.python)
        else:
            source = run.ROOT
            if args.rev:
                source = work / "source"
                source.mkdir()
                archive = subprocess.run(["git", "-C", str(run.ROOT), "archive", "--format=tar", args.rev],
                                         check=True, capture_output=True).stdout
                subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
            run.build_wheel(work, source)
            python = run.remote_venvs(work)[0]
        results = run.level_pairs(work, args.pairs, args.delay, python, http=args.http, via_proxy=args.proxy,
                                  process=args.credential_process, only=tuple(args.only), azure=args.azure)
    results["command"] = "python benchmarks/pairs_levels.py " + " ".join(argv if argv is not None else sys.argv[1:])
    results["date"] = time.strftime("%Y-%m-%d %H:%M")
    results["package"] = f"commit {args.rev}" if args.rev else args.python or "the working tree"
    results["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(run.pairs_table(results))
    fresh = results["fresh machine's last run"]
    print(f"\nPackage: {results['package']}. The fresh machine's last run, the shared level: {fresh}; the cold writer's run: {results['cold']:.2f} s; "
          f"{results['seconds']:.0f} s in all.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
