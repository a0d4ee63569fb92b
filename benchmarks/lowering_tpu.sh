#!/usr/bin/env bash
# Where a warm run's time goes on a TPU (issue 62): benchmarks/lowering.py on the chip, then on the
# same machine's CPU, for a machine with Python 3.11 and JAX installed and no network (a TPU VM).
# The package is put in a virtual environment over the system's site-packages by a .pth line to
# this checkout's src/ (no build needed); platformdirs and flax are installed from pip's configured
# index or from WHEELS=<folder of wheels> where they are missing. Prints the tables.
#
#   bash benchmarks/lowering_tpu.sh            # WHEELS=/path RUNS=3 PYTHON=python3.11 are optional
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3.11}
venv=${TMPDIR:-/tmp}/gkx-lowering-venv
"$python" -m venv --system-site-packages "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
find_links=()
[ -z "${WHEELS:-}" ] || find_links=(--find-links "$WHEELS")
for module in platformdirs flax; do
  "$venv/bin/python" -c "import $module" 2>/dev/null \
    || "$venv/bin/pip" install -q "${find_links[@]}" "$module" \
    || echo "$module cannot be installed here: what needs it is skipped" >&2
done
echo "$PWD/src" > "$site/gkx_autocache_src.pth"
cp gkx_autocache.pth "$site/"
"$venv/bin/python" -c 'import jax, gkx_autocache; print("JAX", jax.__version__, jax.devices())'
mkdir -p .bench/src && printf '[pytest]\n' > .bench/src/pytest.ini
programs="demo,short,many70,flax lm1b"
echo "== the chip (JAX's default platform)"
"$venv/bin/python" benchmarks/lowering.py --platform '' --runs "${RUNS:-3}" --prototype --programs "$programs" "$venv/bin/python"
echo "== the host's CPU"
"$venv/bin/python" benchmarks/lowering.py --platform cpu --runs "${RUNS:-3}" --prototype --programs "$programs" "$venv/bin/python"
