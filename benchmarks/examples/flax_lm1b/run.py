# flax's lm1b example (examples/lm1b at flax commit 18f8f311, Apache License 2.0,
# https://github.com/google/flax/blob/main/LICENSE): models.py, temperature_sampler.py and utils.py
# verbatim, train.py's steps in steps.py. This driver follows train.py's train_and_evaluate
# (lines 362-608) with train_test.py's small configuration: the same TrainState, mesh, shardings,
# donation and jitted train, eval and predict steps, on synthetic tokens in place of the tensorflow
# dataset; no checkpoints, metric writers or tokenizer. Prints a checksum of each step's outputs.
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import linen as nn  # noqa: E402
from flax.training import common_utils  # noqa: E402
from jax import random  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import models  # noqa: E402
import steps  # noqa: E402
import utils  # noqa: E402

# configs/default.py, with train_test.py's overrides.
config = types.SimpleNamespace(
    vocab_size=32, max_corpus_chars=1000, per_device_batch_size=2, eval_per_device_batch_size=2,
    num_train_steps=3, num_eval_steps=1, num_predict_steps=1, num_layers=1, qkv_dim=128, emb_dim=128,
    mlp_dim=512, num_heads=2, max_target_length=32, max_eval_target_length=32, max_predict_length=32,
    logits_via_embedding=False, dropout_rate=0.1, attention_dropout_rate=0.1, use_bfloat16=True, seed=0,
    learning_rate=0.0016, warmup_steps=1000, label_smoothing=0.0, weight_decay=0.1,
    sampling_temperature=0.6, sampling_top_k=20, mesh_axes=["data", "fsdp", "tensor"],
    logical_axis_rules=[["mlp", "tensor"], ["vocab", "tensor"], ["embed", "fsdp"], ["heads", "tensor"]],
    data_sharding=["data"], dcn_data_parallelism=-1, dcn_fsdp_parallelism=1, dcn_tensor_parallelism=1,
    ici_data_parallelism=1, ici_fsdp_parallelism=-1, ici_tensor_parallelism=1,
)
vocab_size, eos_id = config.vocab_size, 2

train_config = models.TransformerConfig(
    vocab_size=vocab_size, output_vocab_size=vocab_size, logits_via_embedding=config.logits_via_embedding,
    dtype=jnp.bfloat16 if config.use_bfloat16 else jnp.float32, emb_dim=config.emb_dim,
    num_heads=config.num_heads, num_layers=config.num_layers, qkv_dim=config.qkv_dim, mlp_dim=config.mlp_dim,
    max_len=max(config.max_target_length, config.max_eval_target_length), dropout_rate=config.dropout_rate,
    attention_dropout_rate=config.attention_dropout_rate, deterministic=False, decode=False,
    kernel_init=nn.initializers.xavier_uniform(), bias_init=nn.initializers.normal(stddev=1e-6),
)
eval_config = train_config.replace(deterministic=True)
predict_config = train_config.replace(deterministic=True, decode=True)

devices_array = utils.create_device_mesh(config)
mesh = Mesh(devices_array, config.mesh_axes)
rng = jax.random.PRNGKey(config.seed)
rng, init_rng = jax.random.split(rng)
rng, inference_rng = random.split(rng)
m = models.TransformerLM(eval_config)
learning_rate_fn = steps.create_learning_rate_schedule(
    learning_rate=config.learning_rate, warmup_steps=config.warmup_steps)
optimizer = optax.adamw(learning_rate_fn, b1=0.9, b2=0.98, eps=1e-9, weight_decay=config.weight_decay)
state, state_mesh_annotations = utils.setup_initial_state(m, optimizer, config, init_rng, mesh)
data_sharding = NamedSharding(mesh, P(config.data_sharding))

jit_train_step = jax.jit(
    steps.train_step, in_shardings=(state_mesh_annotations, data_sharding, None),
    out_shardings=(state_mesh_annotations, None), static_argnums=(2, 3, 4), donate_argnums=0)
jit_eval_step = jax.jit(
    steps.eval_step, in_shardings=(state_mesh_annotations.params, data_sharding), out_shardings=None,
    static_argnums=(2, 3))
jit_pred_step = jax.jit(
    jax.vmap(steps.predict_step, in_axes=(0, jax.tree_util.tree_map(lambda x: None, state.params), 0, None, None,
                                          jax.tree_util.tree_map(lambda x: None, predict_config), None, None)),
    in_shardings=(data_sharding, state_mesh_annotations.params, data_sharding), out_shardings=data_sharding,
    static_argnums=(3, 4, 5, 6, 7))

tokens = np.random.default_rng(0).integers(3, vocab_size, (16, config.max_target_length), dtype=np.int32)
batch_size = config.per_device_batch_size * jax.device_count()
checksums = []
train_metrics = []
dropout_rngs = rng
for step in range(config.num_train_steps):
    batch = {"inputs": jnp.array(tokens[step * batch_size:(step + 1) * batch_size])}
    state, metrics = jit_train_step(state, batch, train_config, learning_rate_fn, 0.0, dropout_rngs)
    train_metrics.append(metrics)
train_metrics = common_utils.stack_forest(train_metrics)
lr = train_metrics.pop("learning_rate").mean()
metrics_sums = jax.tree_util.tree_map(jnp.sum, train_metrics)
denominator = metrics_sums.pop("denominator")
summary = jax.tree_util.tree_map(lambda x: x / denominator, metrics_sums)
checksums.append(float(summary["loss"]))
eval_batch = {"inputs": tokens[:config.eval_per_device_batch_size * jax.device_count()]}
eval_metrics = jit_eval_step(state.params, eval_batch, eval_config)
checksums.append(float(eval_metrics["loss"]))
prompts = np.zeros((jax.local_device_count(), config.max_predict_length), np.int32)
prompts[:, :4] = tokens[:1, :4]
pred_batch = common_utils.shard(prompts)
inference_rng, sub_rng = random.split(inference_rng)
inference_rngs = random.split(sub_rng, jax.local_device_count())
predicted = jit_pred_step(pred_batch, state.params, inference_rngs, eos_id, config.max_predict_length,
                          predict_config, config.sampling_temperature, config.sampling_top_k)
checksums.append(int(np.asarray(predicted).sum()))
print(checksums)
