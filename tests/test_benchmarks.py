"""The benchmark runner, on a tiny workload, so that it cannot rot (its timings are not checked;
the instruction counts, which are deterministic, are)."""

from __future__ import annotations

import json
import shutil
import sys
from typing import Any

import pytest
import servers
from conftest import ROOT


def run(tmp_path_factory: pytest.TempPathFactory, *sections: str) -> tuple[dict[str, Any], str]:
    """`benchmarks/run.py --quick` (its ``--only`` sections, all where none): its JSON, its printed table."""
    out = tmp_path_factory.mktemp("bench") / "results.json"
    only = [arg for section in sections for arg in ("--only", section)]
    # (interrupted, the runner is given the time to remove its temporary folder of environments)
    proc = servers.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", *only, "--out", str(out)],
                       timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), proc.stdout


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """Every section, once for this module (four minutes on two cores)."""
    return run(tmp_path_factory)


@pytest.fixture(scope="module")
def startup_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """The start-up section (20 seconds alone): what the package costs every process of this Python.
    Where the whole run is made too (the first Python, which runs tests marked once), its start-up
    section is this one, measured the same way: not measured twice."""
    if any(item.name == test_runner_produces_every_figure.__name__ for item in request.session.items):
        whole: tuple[dict[str, Any], str] = request.getfixturevalue("quick_run")
        return whole
    return run(tmp_path_factory, "startup")


def test_start_up_adds_no_module_and_no_collection(startup_run: tuple[dict[str, Any], str]) -> None:
    """On every Python: `python -c pass` imports no module of the package; its collections are counted."""
    data, table = startup_run
    assert data["startup"]["extra_modules"] == []
    assert all(n > 0 for n in data["startup"]["young_collections"].values())
    assert "| young-generation garbage collections at start-up |" in table
    assert "| modules added at start-up | none |" in table


@pytest.mark.once  # the runner is this repository's tool; its figures are measured on one line
def test_runner_produces_every_figure(quick_run: tuple[dict[str, Any], str]) -> None:
    """`benchmarks/run.py --quick` builds its venvs, measures every section and writes the JSON."""
    data, table = quick_run
    assert data["startup"]["extra_modules"] == []
    assert set(data["startup_instructions"]) in ({"bytecode present", "bytecode absent", "reference lines"}, {"skipped"})
    assert set(data["workload"]) == {"no cache", "JAX stock cache, default thresholds", "JAX stock cache, thresholds 0",
                                     "gkx-autocache"}
    assert data["workload"]["gkx-autocache"]["warm_hits"] == data["workload"]["gkx-autocache"]["warm_requests"] > 0
    assert data["workload"]["JAX stock cache, default thresholds"]["warm_hits"] == 0
    assert set(data["cli"]) == {"status", "prune --dry-run --max-size 1MB", "prune --dry-run --older-than 1s", "verify",
                                "status, again: the directory unchanged, its count kept", "status, after that run",
                                "ordinary run, folding the ledgers at exit (extra seconds)",
                                "status, a directory the package did not make",
                                "status, again: that directory unchanged, its count kept in the user's cache"}
    assert "| `import jax`, bytecode absent |" in table
    book = data["bookkeeping"]
    assert 0 < book["index of 300 entries: bytes per entry"] < 1000 and book["index of 300 entries: first miss reads it and lists the directory"] > 0
    assert book["beside 1000 lookups: the live process's ledger (bytes)"] < 1 << 20
    assert "| beside 1000 lookups: status |" in table
    assert all(0 < f["configure"] < 5 for f in data["import_jax"].values())
    assert set(data["warm_vs_raw"]) == {"bytecode present", "bytecode absent"}
    assert set(data["own_time"]) == {"bytecode present", "bytecode absent"}
    assert all(min(f["configure"], f["store"], f["exit"]) > 0 and f["exit"] < f["total"] < 2
               for f in data["own_time"].values())
    assert all(w["pairs"] >= 2 and 0.5 < w["ratio"] < 2 for w in data["warm_vs_raw"].values())
    assert data["key_time"]["plain"] > 0 and data["key_time"]["wrapped"] > 0
    assert all(secs > 0 for secs in data["saved_contention"].values()), data["saved_contention"]
    assert "| with the explanation seam (every key: what a hit pays) |" in table
    levels = data["levels"]  # SPEC §14, against moto
    compiles = levels["cold, no shared level"]["compiles"]
    assert compiles > 0 and all(levels[name]["hits"] == compiles for name in levels if name.startswith("warm"))
    assert all(levels[name]["hits"] == 0 for name in levels if name.startswith("cold,"))
    cold = levels["cold requests"]
    assert cold["uploads"] == cold["misses"] == compiles and cold["requests"] == 3 + 2 * compiles  # a listing, a manifest and its pack
    for f in data["prefetch"].values():  # a fresh machine, warm from the bucket: every lookup served, some prefetched
        assert f["fresh machine, from the bucket"]["hits"] == f["local warm (shared set)"]["hits"] == f["entries"] > 0
        assert f["prefetched"] == f["prefetch_used"] > 0 and f["prefetch_wasted_bytes"] == 0, f
    assert "| prefetch: entries, added per request |" in table
    pairs = data["pairs"]  # the levels' fixed costs on the short program: every lookup served in every run
    assert pairs["entries"] > 0 and all(f["hits_A"] == f["hits_B"] == pairs["entries"] for f in pairs["figures"].values())
    assert pairs["fresh machine's last run"]["prefetch_used"] > 0, pairs
    assert "| (b) a fresh machine / local warm, every request +20 ms (median of 1 pairs) |" in table
    http = data["pairs_http"]  # the same against nginx as an HTTP cache (SPEC §14)
    assert http["server"] == "nginx (HTTP)" and http["entries"] == pairs["entries"]
    assert all(f["hits_A"] == f["hits_B"] == http["entries"] for f in http["figures"].values())
    assert http["fresh machine's last run"]["prefetch_used"] > 0, http
    assert "with an HTTP cache (nginx with WebDAV) in place of the bucket" in table
    assert "| cold against an empty bucket / no shared level |" in table


@pytest.mark.skipif(shutil.which("valgrind") is None,
                    reason="valgrind is not installed: benchmarks/run.py skips the instruction counts")
def test_instruction_counts(startup_run: tuple[dict[str, Any], str]) -> None:
    """valgrind counts `python -c pass` with and without the package: the package adds the same, well
    under 3 M instructions, with bytecode and without (a module imported from source adds over 10 M);
    on every Python, whose start-up differs."""
    data, table = startup_run
    counts = data["startup_instructions"]
    added = {case: counts[case]["with"] - counts[case]["without"] for case in ("bytecode present", "bytecode absent")}
    assert all(30e6 < counts[case]["without"] < 100e6 for case in added), counts
    assert all(0 < extra < 3e6 for extra in added.values()), added
    assert abs(added["bytecode present"] - added["bytecode absent"]) < 0.5e6, added
    assert "| `python -c pass`, bytecode absent, instructions |" in table
    # A .pth file that holds only a comment costs something, and less than the package's line.
    (comment,) = (f["with"] - f["without"] for f in counts["reference lines"].values())
    assert 0 < comment < min(added.values()), (comment, added)
    assert "| for reference, instead of the package: a `.pth` file with only a comment |" in table
