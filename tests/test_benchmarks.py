"""The benchmark runner, on a tiny workload, so that it cannot rot (its figures are not checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_runner_produces_every_figure(tmp_path: Path) -> None:
    """`benchmarks/run.py --quick` builds its venvs, measures every section and writes the JSON."""
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["startup"]["extra_modules"] == ["gkx_autocache"]
    assert set(data["workload"]) == {"no cache", "JAX stock cache, default thresholds", "JAX stock cache, thresholds 0",
                                     "gkx-autocache"}
    assert data["workload"]["gkx-autocache"]["warm_hits"] == data["workload"]["gkx-autocache"]["warm_requests"] > 0
    assert data["workload"]["JAX stock cache, default thresholds"]["warm_hits"] == 0
    assert set(data["cli"]) == {"status", "prune --dry-run --max-size 1MB", "verify", "status, after that run",
                                "ordinary run, folding the ledgers at exit (extra seconds)"}
    assert "| `import jax`, bytecode absent |" in proc.stdout
    assert all(0 < f["configure"] < 5 for f in data["import_jax"].values())
