"""Why it missed, at model scale (SPEC §13.1, 2026-12-06; issue 58): a GPT-like model of 112
parameter leaves (embeddings, 9 layers of causal attention and an MLP with LayerNorms, a loss, a
train step with Adam written by hand: 338 inputs), run as its user runs it while changing its
layers, batch, sequence length, dtype, optimizer constant and code, under a threshold, and after a
JAX upgrade; each run's report line and `explain` (JSON and text) read back.

The scenario is one set of runs (about three minutes on two busy cores), made once a session:
pytest-xdist workers share it through a lock, each test reads the runs it checks."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import VERSION_DIR, load_benchmark, make_venv

from gkx_autocache._causes import CHANGED_COMPUTATION, CHANGED_JAX

MODEL = load_benchmark("tpu_explain").MODEL  # the GPT-like model, at the test's sizes (width 16)
EMBEDDED = '    x = 0.5 * params["embed"][tokens] + params["pos"][: tokens.shape[-1]]'
EDITED = '    x = 0.25 * jnp.tanh(params["embed"][tokens]) + params["pos"][: tokens.shape[-1]]'  # tanh added, 0.5 -> 0.25
AS_PYTEST = "def test_model():\n    import main  # the model, run as a test\n"
PYTEST = ("-m", "pytest", "-q", "-p", "no:cacheprovider", "test_model.py")
# Each step: its name, the cache (main, or a directory of its own), its environment, and how it is run.
STEPS: list[tuple[str, str, dict[str, str], tuple[str, ...]]] = [
    ("cold", "main", {}, ()),
    ("layers", "main", {"LAYERS": "11"}, ()),
    ("batch", "main", {"BATCH": "8"}, ()),
    ("sequence", "main", {"SEQ": "8"}, ()),
    ("dtype", "main", {"DTYPE": "bfloat16"}, ()),
    ("rate", "main", {"LR": "0.002"}, ()),
    ("edit", "main", {"LR": "0.002"}, ()),  # the source edited before it (EDITED)
    *((f"time {i}", "main", {"LR": "0.002", "CLOSE_OVER_TIME": "1"}, PYTEST) for i in (1, 2, 3)),
    ("compile time", "thresholds", {"GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS": "1000"}, ()),
    ("entry size", "sizes", {"GKX_JAX_CACHE_MIN_ENTRY_SIZE_BYTES": str(10**9)}, ()),
    ("upgrade", "upgraded", {}, ()),  # main's entries copied to jax-0.0.1/ before it
]
# Quick to compile (the model's figures need no optimised code); the same flags in every run.
ENV = {"GKX_JAX_CACHE_REPORT": "1", "XLA_FLAGS": "--xla_backend_optimization_level=0"}


def run_scenario(wheel: Path, base: Path) -> dict[str, dict[str, Any]]:
    """Every step, in order: its report line, `explain --json` and `explain` after it."""
    base.mkdir(parents=True, exist_ok=True)
    venv = make_venv(base, wheel)
    # A run of its own, as its user runs it: not a worker of this session's pytest-xdist.
    venv.env = {k: v for k, v in venv.env.items() if not k.startswith("PYTEST_")}
    folder = base / "proj"
    folder.mkdir()
    (folder / "main.py").write_text(MODEL)
    (folder / "test_model.py").write_text(AS_PYTEST)
    found: dict[str, dict[str, Any]] = {}
    for name, cache, env, how in STEPS:
        if name == "edit":
            (folder / "main.py").write_text(MODEL.replace(EMBEDDED, EDITED))
        if name == "upgrade":
            shutil.copytree(base / "main" / VERSION_DIR, base / cache / "jax-0.0.1")
        full = {**ENV, "GKX_JAX_CACHE_DIR": str(base / cache), **env}
        started = time.monotonic()
        proc = venv.run(*(how or ("main.py",)), env=full, cwd=str(folder))
        assert proc.returncode == 0, (name, proc.stdout, proc.stderr)
        secs = time.monotonic() - started
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.startswith("gkx-autocache: ")]
        data = json.loads(venv.cli("--json", "explain", env=full).stdout)
        text = venv.cli("explain", env=full).stdout
        found[name] = {"line": lines[0] if lines else "", "explain": data, "text": text, "secs": secs}
    return found


@pytest.fixture(scope="module")
def runs(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The scenario's runs, made by the first worker that asks; the others wait on the lock and
    read what it wrote."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return run_scenario(wheel, tmp_path_factory.mktemp("gpt"))
    root = tmp_path_factory.getbasetemp().parent  # this session's, shared by its workers
    with open(root / "gpt-scenario.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = root / "gpt-scenario.json"
        if done.is_file():
            found: dict[str, dict[str, Any]] = json.loads(done.read_text())
            return found
        if (root / "gpt").exists():  # a worker that failed half-way
            shutil.rmtree(root / "gpt")
        found = run_scenario(wheel, root / "gpt")
        done.write_text(json.dumps(found))
        return found


def last(step: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """The step's own misses: {cause: {function: its entry}}."""
    return {g["cause"]: {f["name"]: f for f in g["functions"]} for g in step["explain"]["groups"]}


def detail(step: dict[str, Any], cause: str, function: str) -> str:
    found = last(step)
    assert function in found.get(cause, {}), (cause, function, json.dumps(found, indent=1))
    text: str = found[cause][function]["detail"]
    return text


def test_more_layers_are_a_changed_computation_said_as_inputs_added(runs: dict[str, dict[str, Any]]) -> None:
    """9 -> 11 layers: the train step's compile options have a value per input and per output (338
    -> 410), which a cut at 300 characters hid, leaving "field 3.12, 3.18 changed" and the fix
    "compile options set in code". Compared whole, they follow the computation: a changed
    computation, said as the inputs added."""
    step = runs["layers"]
    assert "compile options" not in step["line"] and "changed computation" in step["line"], step["line"]
    assert "changed compile options" not in last(step), step["text"]
    found = detail(step, CHANGED_COMPUTATION, "jit_train_step")
    assert found.startswith("338 -> 410 inputs: 72 added (f32[16,16] x24, "), found
    assert "the compile options follow them (allow_spmd_sharding_propagation_to_output: [True x" in found, found
    assert "set in code" not in step["text"], step["text"]


def test_batch_and_sequence_changes_are_said_as_a_difference(runs: dict[str, dict[str, Any]]) -> None:
    """The batch and the sequence length are the train step's last input and a parameter's shape:
    they were after the cut, and explain said "same input shapes: its code ... changed", false."""
    batch = detail(runs["batch"], CHANGED_COMPUTATION, "jit_train_step")
    assert batch == "4 -> 8 in 1 of 338 inputs (i32[4,17] -> i32[8,17])", batch
    sequence = detail(runs["sequence"], CHANGED_COMPUTATION, "jit_train_step")
    assert "16 -> 8 in 3 of 338 inputs (f32[16,16] -> f32[8,16] x3)" in sequence, sequence
    assert re.search(r"in 1 of 338 inputs \(i32\[\d,17\] -> i32\[4,9\]\)", sequence), sequence
    for step in ("batch", "sequence"):
        row = next(ln for ln in runs[step]["text"].splitlines() if ln.strip().startswith("jit_train_step:"))
        assert "same input shapes" not in row, row


def test_a_dtype_change_is_a_changed_computation_not_a_compile_option(runs: dict[str, dict[str, Any]]) -> None:
    """float32 -> bfloat16: the train step's inputs said as one change; a logged statistic of 10
    operations gets an 11th (a convert), and JAX turns xla_detailed_logging on for it: an option
    that follows the computation, never "set in code"."""
    step = runs["dtype"]
    assert "compile options" not in step["line"], step["line"]
    assert detail(step, CHANGED_COMPUTATION, "jit_train_step") == "f32 -> bf16 in 336 of 338 inputs"
    statistic = detail(step, CHANGED_COMPUTATION, "jit_mean_square")
    assert "the compile options follow them (debug_options.xla_detailed_logging: False -> True)" in statistic, statistic
    assert "set in code" not in step["text"], step["text"]


def test_an_optimizer_constant_is_named(runs: dict[str, dict[str, Any]]) -> None:
    """The learning rate, a constant in the train step used once a parameter (112 places, beyond
    the first constants of the module), is named before and after."""
    found = detail(runs["rate"], CHANGED_COMPUTATION, "jit_train_step")
    assert found.startswith("same input shapes (338 inputs: f32[32,16] x3, f32[16,16] x111, f32[16] x141 and 5 more "
                            "shapes): a constant in its code changed, 0.001 -> 0.002 (112 places)"), found


def test_an_edit_that_also_changes_a_constant_is_not_a_constant(runs: dict[str, dict[str, Any]]) -> None:
    """tanh added and 0.5 -> 0.25 in one edit: the computation changed, not "a constant", and no
    "pass it as an argument", which would not have avoided the miss."""
    found = detail(runs["edit"], CHANGED_COMPUTATION, "jit_train_step")
    assert "its operations differ, not only its constants" in found, found
    assert "a constant in its code changed" not in found and "pass it as an argument" not in found, found


def test_misses_on_every_run_only_where_nothing_changed_between_runs(runs: dict[str, dict[str, Any]]) -> None:
    """Three runs in a row that miss the train step (another dtype, a learning rate, an edit) are
    three changes, not "misses on every run"; three runs of one command that close over the time
    are."""
    changed = last(runs["edit"])[CHANGED_COMPUTATION]["jit_train_step"]
    assert "every_run" not in changed, changed
    assert "misses on every run" not in runs["edit"]["text"], runs["edit"]["text"]
    timed = last(runs["time 3"])[CHANGED_COMPUTATION]["jit_mean_square"]
    assert "misses on every run" in timed.get("every_run", ""), timed
    assert "jit_train_step" not in last(runs["time 3"]).get(CHANGED_COMPUTATION, {}), runs["time 3"]["text"]


def test_a_function_missed_in_several_ways_is_not_labelled_with_one(runs: dict[str, dict[str, Any]]) -> None:
    """A statistic logged for two parameters misses twice in the dtype run, each with its own
    inputs: its row says so, not one signature for both."""
    statistic = last(runs["dtype"])[CHANGED_COMPUTATION]["jit_mean_square"]
    assert statistic["count"] == 2 and statistic["changes"] == 2, statistic
    # (the tracing line may name it too, among the slowest, and an earlier run's group its new shapes:
    # its row in the changed-computation group is the one that says what changed in its inputs)
    rows = [ln for ln in runs["dtype"]["text"].splitlines() if "jit_mean_square x2: 2 different details" in ln]
    assert any("the latest: inputs f32[16,16] -> bf16[16,16]" in row for row in rows), rows


def test_complex_inputs_are_shown_as_avals(runs: dict[str, dict[str, Any]]) -> None:
    """A complex input is `c64[16,16]`, like the others, not `tensor<16x16xcomplex<f32>>`."""
    assert detail(runs["sequence"], CHANGED_COMPUTATION, "jit_spectrum") == "inputs c64[16,16] -> c64[8,16]"
    assert all("tensor<" not in step["text"] for step in runs.values())


def test_the_run_label_keeps_an_options_value(runs: dict[str, dict[str, Any]]) -> None:
    """`pytest -q -p no:cacheprovider` is the run's label, not `pytest -q -p`."""
    label = runs["time 3"]["explain"]["last_run"]["label"]
    assert label == "pytest -q -p no:cacheprovider", label


@pytest.mark.parametrize(("step", "reason"), [("compile time", "below min_compile_time_secs"),
                                              ("entry size", "below min_entry_size_bytes")])
def test_thresholds_list_the_users_functions_first_and_mark_jaxs(runs: dict[str, dict[str, Any]], step: str,
                                                                  reason: str) -> None:
    """Under a threshold, the not-cached group names the model's functions first and marks JAX's
    helpers (`jit_broadcast_in_dim`, ...), which were listed first, unmarked, with the user's
    functions folded into "and 3 more"."""
    (group,) = [g for g in runs[step]["explain"]["groups"] if g["cause"] == f"not cached: {reason}"]
    names = [f["name"] for f in group["functions"]]
    mine = {"jit_train_step", "jit_mean_square", "jit_spectrum"}
    assert set(names[:3]) == mine, names
    assert all(f["helper"] for f in group["functions"][3:]) and len(names) > 3, group["functions"]
    text = runs[step]["text"].split("\nearlier")[0]
    section = text[text.index(f"not cached: {reason}"):]
    rows = [row.strip() for row in section.splitlines()[1:]]
    helpers = rows.index("JAX's own helpers:")
    assert all(name in "\n".join(rows[:helpers]) for name in mine), section
    assert not any(name in "\n".join(rows[helpers:]) for name in mine), section


def test_a_jax_upgrade_is_found_for_every_function(runs: dict[str, dict[str, Any]]) -> None:
    """The old version's directory holds the model's entries: every miss is the upgrade (JAX's own
    helpers' further variants too, not "nothing to fix: its first entry here"), and the fix says
    what `prune --stale-versions` frees."""
    step = runs["upgrade"]
    found = last(step)
    assert set(found) == {CHANGED_JAX}, step["text"]
    # (Rebuild ahead, on, compiled what lowers the same from jax-0.0.1's records: what is left missed.)
    assert re.fullmatch(r"gkx-autocache: \d+ hits? \(\d+ rebuilt\), (\d+) miss(es)? \(\1 changed JAX\), .*", step["line"]), step["line"]
    (group,) = step["explain"]["groups"]
    assert "prune --stale-versions frees jax-0.0.1/ (" in group["fix"], group["fix"]


def test_input_lists_are_never_cut_and_counts_count_inputs(runs: dict[str, dict[str, Any]]) -> None:
    """No detail cuts an aval (`f32[5...`), and every "N inputs" counts inputs (338, 410), not the
    commas of 2-D shapes."""
    for name, step in runs.items():
        for group in [*step["explain"]["groups"], *step["explain"]["earlier"]]:
            for function in group["functions"]:
                text = function["detail"]
                assert "..." not in text and not re.search(r"\b[a-z]+\d+\[[\d,]*(?![\d,\]])", text), (name, text)
                counts = {int(n) for n in re.findall(r"(\d+) inputs\b", text)}
                assert counts <= {338, 410}, (name, text)


# -- the pieces, in-process ---------------------------------------------------------------------

LAYER = ["f32[16,16]"] * 4 + ["f32[16]"] * 4 + ["f32[64]", "f32[16]", "f32[16,64]", "f32[64,16]"]


def train_step_inputs(layers: int = 9, dtype: str = "f32", batch: int = 4, seq: int = 16) -> list[str]:
    """The avals of the scenario's train step: parameters, Adam's two moments, a count, the tokens."""
    params = [f"{dtype}[32,16]", *(a.replace("f32", dtype) for a in LAYER * layers), f"{dtype}[16]", f"{dtype}[16]",
              f"{dtype}[{seq},16]"]
    return [*params * 3, "i32[]", f"i32[{batch},{seq + 1}]"]


def test_inputs_are_written_as_jax_writes_avals() -> None:
    """Complex inputs as `c128[28,28]` (not `tensor<28x28xcomplex<f64>>`), and a type's encoding,
    after a comma inside its brackets, is not another input."""
    from gkx_autocache._explain import inputs

    assert inputs.aval("tensor<28x28xcomplex<f64>>") == "c128[28,28]"
    assert inputs.aval("tensor<3xcomplex<f32>>") == "c64[3]"
    assert inputs.aval("tensor<i32>") == "i32[]"
    assert inputs.of_function_type("(tensor<8x8xf32>, tensor<4xf32, #enc<a, b>>, tensor<2xcomplex<f64>>) -> "
                                   "(tensor<f32>)") == "f32[8,8], f32[4], c128[2]"


def test_a_long_list_of_inputs_is_kept_whole_in_what_it_compares() -> None:
    """338 inputs are kept as each aval's count and a digest of the list: read back with their
    number (not the commas of 2-D shapes), equal only where the lists are (order included), and
    two of them said as a difference, never cut inside an aval."""
    from gkx_autocache._explain import inputs

    kept = inputs.kept(train_step_inputs())
    assert len(kept) < 200 and kept.startswith("338 inputs: f32[32,16] x3, f32[16,16] x111, f32[16] x141, "), kept
    assert inputs.count_of(kept) == 338 and inputs.count_of("f32[8,8], f32[4,4]") == 2
    reordered = inputs.kept(train_step_inputs()[::-1])
    assert reordered != kept and inputs.change(kept, reordered) == "the same 338 inputs in another order"
    assert inputs.shown(kept) == "338 inputs: f32[32,16] x3, f32[16,16] x111, f32[16] x141 and 5 more shapes"
    assert inputs.change(kept, inputs.kept(train_step_inputs(layers=11))) == (
        "338 -> 410 inputs: 72 added (f32[16,16] x24, f32[16] x30, f32[64] x6, f32[16,64] x6 and 1 more shape)")
    assert inputs.change(kept, inputs.kept(train_step_inputs(dtype="bf16"))) == "f32 -> bf16 in 336 of 338 inputs"
    assert inputs.change(kept, inputs.kept(train_step_inputs(batch=32))) == (
        "4 -> 32 in 1 of 338 inputs (i32[4,17] -> i32[32,17])")
    assert inputs.change("f32[64]", "f32[32]") == "inputs f32[64] -> f32[32]"
    old = "f32[32,16], f32[16,16], f32[16,16], f32[5... (602 inputs)"  # an older gkx-autocache's cut
    assert inputs.change(old, kept) == ("inputs (recorded in part, by an older gkx-autocache) -> 338 inputs: "
                                        "f32[32,16] x3, f32[16,16] x111, f32[16] x141 and 5 more shapes")


def test_a_compile_option_is_compared_whole() -> None:
    """A value per input, 338 of them, and 410: kept in short with a digest of the whole, so that
    they differ (a cut at 300 characters made them equal), never cut inside a value."""
    from gkx_autocache._explain import facts

    few, more = facts.bounded(repr([True] * 338)), facts.bounded(repr([True] * 410))
    assert few.startswith("[True x338] #") and more.startswith("[True x410] #") and few != more
    mixed = facts.bounded(repr([True] * 300 + [False] + [True] * 37))
    assert mixed.startswith("[True x300, False, True x37] #"), mixed
    assert facts.bounded(repr([True] * 338)[:300]) != facts.bounded(repr([True] * 339)[:300] + "]")
    long = facts.bounded(repr(list(range(400))))
    assert long.endswith(f"({len(repr(list(range(400))))} characters) #{long.rsplit('#', 1)[1]}"), long
    assert ", ..." in long and long.split(", ...")[0].endswith(("8", "9", "0", "1", "2", "3", "4", "5", "6", "7"))


def test_the_run_label_keeps_the_value_of_the_option_it_ends_with(monkeypatch: pytest.MonkeyPatch) -> None:
    """`pytest -q -p no:cacheprovider`: the run's label keeps `-p`'s value."""
    import sys

    from gkx_autocache import _diagnostics

    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setattr(sys, "argv", ["/venv/lib/python3.11/site-packages/pytest/__main__.py", "-q", "-p",
                                      "no:cacheprovider", "tests/"])
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/"])
    assert _diagnostics.label() == "pytest -q -p no:cacheprovider"
    monkeypatch.setattr(sys, "argv", ["train.py", "--layers", "12", "--seq", "256"])
    assert _diagnostics.label() == "train.py --layers 12"


def test_the_files_of_a_computation_are_read_without_waiting(tmp_path: Path) -> None:
    """What a rerun compares reads the files the MLIR locations name, in the user's process at a
    miss: a FIFO named like a source file (or a file gone) is not waited on, and an edit changes
    the digest where a second read of the same file does not."""
    from gkx_autocache._explain import facts

    fifo, source = tmp_path / "model.py", tmp_path / "train.py"
    os.mkfifo(fifo)
    source.write_text("LR = 0.001\n")
    first = facts.rerun_of("f32[8]", (str(fifo), str(source), str(tmp_path / "gone.py")))
    assert first == facts.rerun_of("f32[8]", (str(fifo), str(source), str(tmp_path / "gone.py")))
    source.write_text("LR = 0.0025\n")  # (another size: the digest is kept by path, time and size)
    assert facts.rerun_of("f32[8]", (str(fifo), str(source), str(tmp_path / "gone.py"))) != first
    assert facts.rerun_of("f32[9]", (str(source),)) != facts.rerun_of("f32[8]", (str(source),))
