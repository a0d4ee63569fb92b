"""A real two-user race on a team directory (SPEC §8, amended 2026-12-02), as root on Linux:

    python benchmarks/race_team_swap.py [--src SRC] [--tries N]

A team directory (2770, group 3000, no sticky bit) is shared by a victim (uid 1002) and a member
(uid 1001). The victim makes a cache in it N times (``_cache.prepare`` and the ledger's
bookkeeping directory); the member polls the team directory and swaps every new directory it sees
(the root, its version directory, ``.gkx-autocache``, ``ledger``) for a symlink to the victim's
private directory (0700). Prints the tries, the swaps, the victim's refusals, and whether the
private directory was changed (made group-writable, tagged, written in): the package's code from
``--src`` (default: this checkout's), so an older checkout can be raced too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from conftest import as_user  # noqa: E402  (the tests' non-root users, in a private mount namespace)

ATTACKER = r"""
import os, sys, time
team, private = sys.argv[1], sys.argv[2]
swapped, deadline = 0, time.monotonic() + 600
while time.monotonic() < deadline and not os.path.exists(os.path.join(team, "STOP")):
    for folder, dirs, _ in os.walk(team):
        for name in dirs:
            path = os.path.join(folder, name)
            if name.endswith(".moved") or os.path.exists(path + ".moved"):
                continue
            try:
                os.rename(path, path + ".moved")
                os.symlink(private, path)
                swapped += 1
            except OSError:
                pass
print(swapped)
"""

VICTIM = r"""
import os, sys
sys.path.insert(0, sys.argv[3])
from gkx_autocache import _cache, _files
team, private, tries = sys.argv[1], sys.argv[2], int(sys.argv[4])
refused = changed = 0
for i in range(tries):
    try:
        prepared = _cache.prepare(os.path.join(team, f"c{i}"), "0.0.0", team=True)
        _files.bookkeeping_dir(prepared.version_dir, True, "ledger")
    except _cache.DirectoryRefused:
        refused += 1
    if os.stat(private).st_mode & 0o7777 != 0o700 or os.listdir(private):
        changed = i + 1
        break
open(os.path.join(team, "STOP"), "w").close()
print(i + 1, refused, changed, oct(os.stat(private).st_mode & 0o7777), sorted(os.listdir(private)))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default=str(ROOT / "src"))
    parser.add_argument("--tries", type=int, default=500)
    args = parser.parse_args()
    base = Path("/tmp/gkx-race")
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(mode=0o755)
    team, private = base / "team", base / "private"
    team.mkdir()
    os.chown(team, 1001, 3000)
    team.chmod(0o2770)
    private.mkdir()
    os.chown(private, 1002, 1002)
    private.chmod(0o700)
    env = {"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"}
    attacker = subprocess.Popen(as_user(1001, [sys.executable, "-c", ATTACKER, str(team), str(private)], (3000,)),
                                env=env, stdout=subprocess.PIPE, text=True)
    victim = subprocess.run(as_user(1002, [sys.executable, "-c", VICTIM, str(team), str(private), args.src,
                                           str(args.tries)], (3000,)), env=env, capture_output=True, text=True)
    swapped, _ = attacker.communicate(timeout=120)
    if victim.returncode != 0:
        sys.exit(victim.stderr)
    tries, refused, changed, mode, left = victim.stdout.split(maxsplit=4)
    print(f"tries {tries}, directories swapped {swapped.strip()}, refused {refused}; private directory {mode}, "
          f"holding {left.strip()}: {'CHANGED at try ' + changed if changed != '0' else 'unchanged'}")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
