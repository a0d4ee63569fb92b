"""What the evidence knows, said (SPEC §13.1; issue 70): causes that were true but led the wrong way,
or said less than the module tells. Real model code (equinox, a GPT-like model in plain JAX, a
data-parallel `Mesh` of 8 host devices), run as module files in fresh processes: a mesh shrunk is a
change of devices; one function name in two modules is two functions; JAX's own helpers change with
JAX; inserted layers are added inputs; donation, an input's sharding and the output shapes are named;
"misses on every run" does not depend on `--since`; a lambda has one name."""

from __future__ import annotations

import math
import re
import shutil
import time

from conftest import Project, load_benchmark

from gkx_autocache._causes import CHANGED_COMPUTATION, CHANGED_JAX, NEW, changed

DATA_PARALLEL = r"""
import json, os
import jax, jax.numpy as jnp
import equinox as eqx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = Mesh(jax.devices()[:int(os.environ.get("MESH", "8"))], ("data",))
batch = P("data") if os.environ.get("SPEC", "data") == "data" else P(None)

class MLP(eqx.Module):
    layers: list
    def __init__(self, key):
        keys = jax.random.split(key, 3)
        self.layers = [eqx.nn.Linear(16, 32, key=keys[0]), eqx.nn.Linear(32, 32, key=keys[1]),
                       eqx.nn.Linear(32, 1, key=keys[2])]
    def __call__(self, x):
        for layer in self.layers[:-1]:
            x = jax.nn.relu(layer(x))
        return self.layers[-1](x)[0]

def loss(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)

def train_step(model, x, y):
    grads = jax.grad(loss)(model, x, y)
    return jax.tree.map(lambda p, g: p - 0.01 * g, model, grads)

step = jax.jit(train_step, donate_argnums=(0,) if os.environ.get("DONATE") else ())
model = MLP(jax.random.key(0))
x = jax.device_put(jnp.ones((64, 16)), NamedSharding(mesh, batch))
y = jax.device_put(jnp.zeros(64), NamedSharding(mesh, batch))
model = step(model, x, y)
print(json.dumps({"result": float(model.layers[-1].bias[0])}))
"""
EIGHT = {"JAX_NUM_CPU_DEVICES": "8"}


def test_a_mesh_shrunk_is_a_change_of_devices_not_of_compile_options(project: Project) -> None:
    """A data-parallel train step over a mesh of 8 host devices, then 4 (the process still has 8):
    `num_partitions` and the device assignment follow from the mesh, which nobody set as a compile
    option: `changed devices`, the mesh before and after, each field once, and a fix about meshes;
    on 7906ae9 it was `changed compile options` ("set in code or jax.config"), each field twice."""
    project.write("main.py", DATA_PARALLEL)
    project.run(**EIGHT)
    project.run(MESH="4", **EIGHT)
    groups = {g["cause"]: g for g in project.explain()["groups"]}
    assert "changed compile options" not in groups, groups
    group = groups[changed("devices")]
    step = next(f for f in group["functions"] if f["name"] == "jit_train_step")["detail"]
    assert step.startswith("mesh of 8 -> 4 devices (num_partitions 8 -> 4, device_assignment "), step
    assert step.count("num_partitions") == 1 and step.count("device_assignment") == 1, step
    assert "set in code" not in group["fix"] and "a Mesh over other devices" in group["fix"], group["fix"]


MLP_MODEL = """
import jax, jax.numpy as jnp
import equinox as eqx

class MLP(eqx.Module):
    layers: list
    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.layers = [eqx.nn.Linear(8, 16, key=k1), eqx.nn.Linear(16, 1, key=k2)]
    def __call__(self, x):
        return self.layers[1](jax.nn.relu(self.layers[0](x)))[0]

def loss(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)

@eqx.filter_jit
def train_step(model, x, y):
    grads = eqx.filter_grad(loss)(model, x, y)
    return jax.tree.map(lambda p, g: p - 0.01 * g, model, grads)
"""
CONV_MODEL = """
import jax, jax.numpy as jnp
import equinox as eqx

LR = 0.01

class CNN(eqx.Module):
    conv: eqx.nn.Conv1d
    head: eqx.nn.Linear
    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.conv = eqx.nn.Conv1d(1, 4, 3, key=k1)
        self.head = eqx.nn.Linear(24, 1, key=k2)
    def __call__(self, x):
        return self.head(jax.nn.relu(self.conv(x[None])).ravel())[0]

def loss(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)

@eqx.filter_jit
def train_step(model, x, y):
    grads = eqx.filter_grad(loss)(model, x, y)
    return jax.tree.map(lambda p, g: p - LR * g, model, grads)
"""
TWO_MODELS = """
import json
import jax, jax.numpy as jnp
import mlp_model, conv_model
x, y = jnp.ones((32, 8)), jnp.zeros(32)
mlp = mlp_model.train_step(mlp_model.MLP(jax.random.key(0)), x, y)
cnn = conv_model.train_step(conv_model.CNN(jax.random.key(1)), x, y)
print(json.dumps({"result": float(mlp.layers[1].bias[0] + cnn.head.bias[0])}))
"""


def write_two_models(project: Project) -> None:
    project.write("mlp_model.py", MLP_MODEL)
    project.write("conv_model.py", CONV_MODEL)
    project.write("main.py", TWO_MODELS)


def test_one_name_in_two_modules_is_another_function_and_a_change_names_its_module(project: Project) -> None:
    """`train_step` in mlp_model.py and in conv_model.py, both `eqx.filter_jit`: on the cold run the
    second is another function, in its module (on 7906ae9: "a further variant of jit_train_step",
    though no entry is at its place); after an edit of conv_model.py the miss says which module."""
    write_two_models(project)
    project.run()
    (group,) = [g for g in project.explain()["groups"] if g["cause"] == NEW]
    step = next(f for f in group["functions"] if f["name"] == "jit_train_step")
    assert step["detail"] == "another jit_train_step, in conv_model.py (its entries here are in mlp_model.py)", step
    project.write("conv_model.py", CONV_MODEL.replace("LR = 0.01", "LR = 0.02"))
    project.run()
    found = project.last()
    assert set(found) == {CHANGED_COMPUTATION}, found
    detail = found[CHANGED_COMPUTATION]["jit_train_step"]
    assert detail.startswith("the jit_train_step in conv_model.py: same input shapes ("), detail
    assert "a constant in its code changed, 0.01 -> 0.02" in detail, detail


def test_after_a_jax_upgrade_jaxs_own_helper_is_changed_jax_like_the_others(project: Project) -> None:
    """The old JAX's directory holds entries of JAX's own `jit_convert_element_type`, without a record
    of where their code is (as stock JAX, an older gkx-autocache or a bundle without records leaves
    them): in the run where every other function is `changed JAX`, the helper is too (on 7906ae9:
    "cannot tell: new, or JAX 0.0.1 -> ...", with "if not, its first entry here")."""
    write_two_models(project)
    project.run()
    older = project.vdir.parent / "jax-0.0.1"  # what the JAX before wrote (test_explain_real's way)
    shutil.copytree(project.vdir, older)
    shutil.rmtree(project.vdir)
    index = older / ".gkx-autocache" / "index"
    lines = index.read_text().splitlines()
    assert any(ln.startswith("E\tjit_convert_element_type\t") for ln in lines), lines
    index.write_text("".join(f"{ln}\n" for ln in lines if not ln.startswith("E\tjit_convert_element_type\t")))
    project.run()
    groups = {g["cause"]: g for g in project.explain()["groups"]}
    assert set(groups) == {CHANGED_JAX}, groups
    helper = next(f for f in groups[CHANGED_JAX]["functions"] if f["name"] == "jit_convert_element_type")
    assert helper["helper"] and helper["detail"].startswith("JAX 0.0.1 -> "), helper
    assert "its first entry here" not in groups[CHANGED_JAX]["fix"], groups[CHANGED_JAX]["fix"]


GPT = load_benchmark("tpu_explain").MODEL  # the GPT-like model of test_explain_models, at width 16


def test_inserted_layers_are_added_inputs_not_changed_shapes(project: Project) -> None:
    """2 -> 4 layers and sequence 12 -> 8 in one run: the inputs are compared by their order, so the
    layers inserted are added, and the position table is the one that changed (on 7906ae9, paired
    by shape alone: "12 -> 16 in 3 inputs (f32[12,16] -> f32[16,16] x3)", a layer's weights)."""
    project.write("main.py", GPT)
    project.run(LAYERS="2", SEQ="12")
    project.run(LAYERS="4", SEQ="8")
    detail = project.last()[CHANGED_COMPUTATION]["jit_train_step"]
    assert detail.startswith("86 -> 158 inputs: 12 -> 8 in 3 inputs (f32[12,16] -> f32[8,16] x3); 13 -> 9 in 1 input "
                             "(i32[4,13] -> i32[4,9]); 72 added (f32[16,16] x24, f32[16] x30, f32[64] x6, f32[16,64] x6 "
                             "and 1 more shape)"), detail


def test_donation_is_named(project: Project) -> None:
    """`donate_argnums=(0,)` added: the module marks the donated inputs, so the miss names them (on
    7906ae9: "its code, a static argument, a closed-over constant, or a weak type ... changed")."""
    project.write("main.py", DATA_PARALLEL)
    project.run(**EIGHT)
    project.run(DONATE="1", **EIGHT)
    (group,) = [g for g in project.explain()["groups"] if g["cause"] == CHANGED_COMPUTATION]
    assert group["fix"].startswith("nothing to fix if you changed which arguments are donated (donate_argnums"), group
    detail = project.last()[CHANGED_COMPUTATION]["jit_train_step"]
    assert detail == ("same input shapes (f32[32,16], f32[32], f32[32,32], f32[32], f32[1,32], f32[1], f32[64,16], "
                      "f32[64]): donated inputs: none -> 6 of 8 (f32[32,16], f32[32] x2, f32[32,32], f32[1,32] and 1 "
                      "more shape)"), detail


def test_an_input_sharding_is_named(project: Project) -> None:
    """The batch placed with `P('data')`, then `P(None)`: the module carries each input's sharding,
    so the miss names it, before and after."""
    project.write("main.py", DATA_PARALLEL)
    project.run(**EIGHT)
    project.run(SPEC="none", **EIGHT)
    (group,) = [g for g in project.explain()["groups"] if g["cause"] == CHANGED_COMPUTATION]
    assert group["fix"].startswith("nothing to fix if you placed the inputs otherwise (another PartitionSpec"), group
    detail = project.last()[CHANGED_COMPUTATION]["jit_train_step"]
    assert detail == ("same input shapes (f32[32,16], f32[32], f32[32,32], f32[32], f32[1,32], f32[1], f32[64,16], "
                      "f32[64]): the sharding of 2 of 8 inputs: P('data') -> P(None) (f32[64,16], f32[64])"), detail


TOP_K = r"""
import json, os
import jax, jax.numpy as jnp
from jax import lax

K = int(os.environ["K"])  # how many neighbours: a closed-over constant that sets an output shape

@jax.jit
def retrieve(queries, keys):
    scores = queries @ keys.T
    return lax.top_k(scores, K)

values, indices = retrieve(jnp.ones((8, 16)), jnp.ones((100, 16)))
print(json.dumps({"result": float(values.sum()), "k": int(indices.shape[-1])}))
"""


def test_output_shapes_are_compared(project: Project) -> None:
    """A closed-over `k` of `lax.top_k` changes only the output shapes: named before and after."""
    project.write("main.py", TOP_K)
    project.run(K="3")
    project.run(K="5")
    detail = project.last()[CHANGED_COMPUTATION]["jit_retrieve"]
    assert detail == ("same input shapes (f32[8,16], f32[100,16]): outputs f32[8,3], i32[8,3] -> f32[8,5], i32[8,5]: "
                      "a static argument or a closed-over value that sets a shape changed, or its code"), detail


CLOCK_SEED = r"""
import json, time
import jax, jax.numpy as jnp

SEED = int(time.time() * 1000) % 2**31  # a clock seed, closed over: another constant every run

@jax.jit
def noisy_step(w, x):
    noise = jax.random.normal(jax.random.key(SEED), x.shape)
    return w - 0.01 * (x + noise)

print(json.dumps({"result": float(noisy_step(jnp.ones(8), jnp.ones(8)).sum())}))
"""


def test_misses_on_every_run_does_not_depend_on_the_since_window(project: Project) -> None:
    """A clock seed closed over misses on every run: `explain --since` with a window that holds the
    last run alone still flags it (on 7906ae9 the flag was computed inside the window)."""
    project.write("main.py", CLOCK_SEED)
    for _ in range(3):
        project.run()
    time.sleep(2.5)
    started = time.time()
    project.run()
    window = f"{math.ceil(time.time() - started) + 1}s"  # the last run, not the one before (2.5 s earlier)
    data = project.explain("--since", window)
    assert data["earlier"] == [], data["earlier"]
    (group,) = [g for g in data["groups"] if g["cause"] == CHANGED_COMPUTATION]
    step = next(f for f in group["functions"] if f["name"] == "jit_noisy_step")
    assert "misses on every run" in step.get("every_run", ""), step


LAMBDA = r"""
import json
import jax, jax.numpy as jnp

def body(x):
    for i in range(60):  # slow enough to trace to be among the slowest
        x = jnp.tanh(x) * (1.0 + i / 60)
    return x.sum()

predict = jax.jit(lambda x: body(x))
print(json.dumps({"result": float(predict(jnp.ones((8, 64))))}))
"""


def test_a_lambda_has_one_name_in_the_tracing_line_and_the_causes(project: Project) -> None:
    """JAX names a lambda's module `jit__lambda`: the tracing line says so too, not `jit_<lambda>`."""
    project.write("main.py", LAMBDA)
    project.run()
    traced = [f["function"] for f in project.explain()["last_run"]["tracing_by_function"]]
    assert "jit__lambda" in traced and "jit_<lambda>" not in traced, traced
    text = project.venv.cli("explain", env=project.env).stdout
    assert "<lambda>" not in text and re.search(r"tracing and lowering .*jit__lambda \d", text), text
    assert "jit__lambda" in project.last()[NEW], text


# -- the pieces, in-process ---------------------------------------------------------------------

def gpt_inputs(layers: int, seq: int, dtype: str = "f32") -> list[str]:
    """The avals of the GPT-like model's train step: parameters, Adam's count and two moments, the tokens."""
    layer = ["f32[16,16]"] * 4 + ["f32[16]"] * 4 + ["f32[64]", "f32[16]", "f32[16,64]", "f32[64,16]"]
    params = [a.replace("f32", dtype) for a in ["f32[32,16]", *layer * layers, "f32[16]", "f32[16]", f"f32[{seq},16]"]]
    return [*params, "i32[]", *params, *params, f"i32[4,{seq + 1}]"]


def test_a_long_lists_order_is_kept_in_short_and_read_back_only_as_itself() -> None:
    """A train step's 338 inputs: their order in some 40 characters, read back whole; an order that
    does not give the kept list back (another list's, a torn one) is not used."""
    from gkx_autocache._explain import inputs

    nine, eleven = gpt_inputs(9, 16), gpt_inputs(11, 16)
    order = inputs.order_of(nine)
    assert order is not None and len(order) < 80, order
    assert inputs.listed(inputs.kept(nine), order) == nine
    assert inputs.listed(inputs.kept(eleven), order) is None  # another list's order
    torn = order[:20] + ("0" if order[20] != "0" else "1") + order[21:]
    assert inputs.listed(inputs.kept(nine), torn) is None and inputs.listed(inputs.kept(nine), "%%") is None
    assert inputs.order_of(["f32[8]", "i32[]"]) is None and inputs.listed("f32[8], i32[]") == ["f32[8]", "i32[]"]
    assert inputs.ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8" and inputs.indices("0-2,5,7-8") == [0, 1, 2, 5, 7, 8]


def test_inserted_inputs_are_aligned_and_the_rest_paired_by_what_is_new_to_the_list() -> None:
    """Layers inserted with another change beside them: aligned, what was inserted is added; where
    the order is not known, a removed aval is paired first with one new to the list (the position
    table f32[256,16] -> f32[128,16], not a layer's f32[16,64], which there were before)."""
    import random
    from collections import Counter

    from gkx_autocache._explain import inputs

    old, new = gpt_inputs(4, 256), gpt_inputs(6, 128)
    expected = ("158 -> 230 inputs: 256 -> 128 in 3 inputs (f32[256,16] -> f32[128,16] x3); 257 -> 129 in 1 input "
                "(i32[4,257] -> i32[4,129]); 72 added (f32[16,16] x24, f32[16] x30, f32[64] x6, f32[16,64] x6 and 1 "
                "more shape)")
    kept_old, kept_new = inputs.kept(old), inputs.kept(new)
    assert inputs.change(kept_old, kept_new, (inputs.order_of(old), inputs.order_of(new))) == expected
    assert inputs.change(kept_old, kept_new) == expected  # by their counts alone
    assert inputs.change(inputs.kept(gpt_inputs(6, 16)), inputs.kept(gpt_inputs(4, 16)), (
        inputs.order_of(gpt_inputs(6, 16)), inputs.order_of(gpt_inputs(4, 16)))).startswith("230 -> 158 inputs: 72 removed")
    # Lists of one length: place by place (a dtype and a batch changed, nothing inserted).
    assert inputs.change("f32[8,3], f32[16,8], i32[4,17], f32[3]", "bf16[8,3], bf16[16,8], i32[8,17], f32[3]") == (
        "f32 -> bf16 in 2 of 4 inputs; 4 -> 8 in 1 of 4 inputs (i32[4,17] -> i32[8,17])")
    # The edit script is a shortest one: as long as the lists' longest common subsequence says.
    rng = random.Random(70)
    for _ in range(300):
        a = [rng.choice("abc") for _ in range(rng.randint(0, 10))]
        b = [rng.choice("abc") for _ in range(rng.randint(0, 10))]
        blocks = inputs._blocks(a, b)
        assert blocks is not None
        common = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
        for i in range(len(a) - 1, -1, -1):
            for j in range(len(b) - 1, -1, -1):
                common[i][j] = common[i + 1][j + 1] + 1 if a[i] == b[j] else max(common[i + 1][j], common[i][j + 1])
        assert sum(len(gone) for gone, _ in blocks) == len(a) - common[0][0], (a, b, blocks)
        assert Counter(a) - Counter(x for gone, _ in blocks for x in gone) == \
            Counter(b) - Counter(x for _, added in blocks for x in added), (a, b, blocks)


def test_an_inputs_sharding_is_said_as_a_person_writes_it() -> None:
    """Shardy's shardings as `P(...)` (the dimensions left whole: `None`); any other as written."""
    from gkx_autocache._explain import facts

    assert facts.sharding_text('#sdy.sharding<@mesh, [{"data"}, {}]>') == "P('data')"
    assert facts.sharding_text("#sdy.sharding<@mesh, [{}, {}]>") == "P(None)"
    assert facts.sharding_text('#sdy.sharding<@mesh, [{"a", "b"}, {"c"}]>') == "P(('a', 'b'), 'c')"
    assert facts.sharding_text('"{devices=[8,1]<=[8]}"') == "{devices=[8,1]<=[8]}"
    assert facts.sharding_text('#sdy.sharding<@mesh, [{"data", ?}, {}]>') == '#sdy.sharding<@mesh, [{"data", ?}, {}]>'


def test_a_meshs_compile_options_are_said_as_the_mesh_once() -> None:
    """num_partitions and the device assignment, at the top and under executable_build_options: the
    mesh, each field once; the device assignment alone is still a rank's."""
    import json

    from gkx_autocache._explain import classify

    def options(n: int) -> str:
        assignment = (f"DeviceAssignment{{replica_count=1, computation_count={n}, "
                      + " ".join(f"Computation{i}{{{i}}}" for i in range(n)) + "}")
        return json.dumps({"num_partitions": str(n), "device_assignment": assignment,
                           "executable_build_options.num_partitions": str(n),
                           "executable_build_options.device_assignment": assignment})

    found = classify.compile_options_change(options(8), options(4), "")
    assert found == {"cause": "changed devices", "by": "mesh", "detail": "mesh of 8 -> 4 devices (num_partitions 8 -> "
                     "4, device_assignment devices 0-7 -> 0-3)"}, found
    rank = json.loads(options(1))
    other = {**rank, "device_assignment": rank["device_assignment"].replace("{0}}", "{1}}")}
    other["executable_build_options.device_assignment"] = other["device_assignment"]
    assert classify.compile_options_change(json.dumps(rank), json.dumps(other), "")["cause"] == "changed device assignment"


def test_a_traced_functions_name_is_its_modules() -> None:
    """JAX's tracing event names `jit(<lambda>)`, its module `jit__lambda`."""
    from gkx_autocache._record.recorder import module_name

    assert module_name("jit(<lambda>)") == "jit__lambda" and module_name("jit(step)") == "jit_step"
    assert module_name("step") == "jit_step" and module_name("pmap(f)") == "pmap_f" and module_name("") == ""
