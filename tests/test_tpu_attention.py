"""The TPU attention path (jaxrag/models/tpu_attention.py) against jaxrag's XLA attention, run on CPU in Pallas'
TPU interpret mode: JAX's splash-attention kernel itself (forward and its custom-VJP dq/dkv kernels) executes,
block by block, with out-of-bounds reads checked. Values and gradients on every mask the model uses (causal,
left/right padding, packed segments) with GQA, MHA and MQA heads, lengths that are and are not a multiple of the
kernel's 128-wide blocks, and the model's forward and prefill with attention_impl="splash".

Interpret mode is slow (seconds per kernel call on CPU): shapes are tiny and the cases few."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrag.models import ModelConfig, forward, init_params, tpu_attention
from jaxrag.models.config import ATTENTION_IMPLS
from jaxrag.models.transformer import attention, attention_mask, cache_block, init_cache, prefill, resolve_attention_impl


def segments(T: int) -> np.ndarray:
    """[3,T] segment ids: right padding, left padding, three packed segments then padding."""
    a, b = T // 2, T // 3
    return np.array([[1] * (T - 5) + [0] * 5,
                     [0] * a + [1] * (T - a),
                     [1] * b + [2] * b + [3] * (T - 2 * b - 1) + [0]], np.int32)


def xla_attention(q, k, v, seg):
    return attention(q, k, v, attention_mask(seg), "highest")


def value_and_grads(fn, q, k, v, seg):
    """sum(sin(out)) over real tokens (padding rows are never read) and its gradients w.r.t. q, k, v."""
    w = (seg != 0).astype(jnp.float32)[..., None, None]
    return jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v, seg)) * w), argnums=(0, 1, 2)))(
        q, k, v)


@pytest.mark.parametrize("T,H,K,Dh", [
    (128, 4, 2, 16),   # GQA, T one 128 block
    (200, 4, 1, 8),    # MQA, T padded to 256 (one 256 block)
    (300, 2, 2, 8),    # MHA, T padded to 384 (three 128 blocks: blocks above the diagonal skipped)
])
def test_splash_equals_xla_attention_values_and_gradients(T, H, K, Dh):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(T), 3)
    q = jax.random.normal(kq, (3, T, H, Dh))
    k = jax.random.normal(kk, (3, T, K, Dh))
    v = jax.random.normal(kv, (3, T, K, Dh))
    seg = jnp.asarray(segments(T))
    real = np.asarray(seg) != 0
    ref_val, ref_grads = value_and_grads(xla_attention, q, k, v, seg)
    with tpu_attention.interpret_mode():
        out = jax.jit(tpu_attention.splash_attention)(q, k, v, seg)
        val, grads = value_and_grads(tpu_attention.splash_attention, q, k, v, seg)
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(xla_attention(q, k, v, seg))[real], atol=2e-5)
    np.testing.assert_allclose(val, ref_val, rtol=1e-5)
    for got, ref, name in zip(grads, ref_grads, "qkv"):
        np.testing.assert_allclose(got, ref, atol=5e-5, err_msg=f"d{name}")
    assert np.isfinite(np.asarray(out)).all()   # padding rows too: none is fully masked


def test_splash_kernel_in_tpu_interpret_mode_values_and_gradients():
    """The per-example kernel as splash_attention builds it (causal + packed segment ids + padding, GQA), in two
    128 blocks (the block above the diagonal skipped), under the TPU interpreter, which simulates VMEM and DMAs
    and raises on out-of-bounds reads. JAX 0.10.2's TPU interpreter cannot run the batch-vmapped call
    (interpret_mode's docstring): the HLO interpreter runs that one above."""
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu import splash_attention as sa
    T, H, K, Dh = 256, 4, 2, 16
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(3), 3)
    q, k, v = jax.random.normal(kq, (1, T, H, Dh)), jax.random.normal(kk, (1, T, K, Dh)), jax.random.normal(kv, (1, T, K, Dh))
    seg = jnp.asarray(segments(T)[2:])    # three packed segments, then padding
    kernel = tpu_attention._kernel(H, T, 128)

    def one(q, k, v, seg):   # [1,T,H,Dh] -> [1,T,H,Dh], as _splash_local for one row without vmap
        out = kernel((q[0] / np.sqrt(Dh)).swapaxes(0, 1), k[0].swapaxes(0, 1), v[0].swapaxes(0, 1),
                     segment_ids=sa.SegmentIds(seg[0], seg[0]))
        return out.swapaxes(0, 1)[None]

    ref_val, ref_grads = value_and_grads(xla_attention, q, k, v, seg)
    with tpu_attention.interpret_mode(pltpu.InterpretParams()):
        val, grads = value_and_grads(one, q, k, v, seg)
    np.testing.assert_allclose(val, ref_val, rtol=1e-5)
    for got, ref, name in zip(grads, ref_grads, "qkv"):
        np.testing.assert_allclose(got, ref, atol=5e-5, err_msg=f"d{name}")


def test_splash_without_segment_ids_is_plain_causal():
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(7), 3)
    q, k, v = (jax.random.normal(x, (1, 40, 2, 8)) for x in (kq, kk, kv))   # T = 40 padded to 128
    with tpu_attention.interpret_mode():
        got = jax.jit(lambda q, k, v: tpu_attention.splash_attention(q, k, v, None))(q, k, v)
    np.testing.assert_allclose(got, xla_attention(q, k, v, jnp.ones((1, 40), jnp.int32)), atol=2e-5)


CFG = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                  max_seq_len=64, attention_impl="xla")


def test_model_forward_gradients_and_prefill_with_splash_equal_xla():
    T = 12
    seg = jnp.asarray(segments(T))
    pos = jnp.asarray(np.where(segments(T) != 0, np.arange(T), 0), jnp.int32)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, T), 1, CFG.vocab_size)
    params = init_params(CFG, jax.random.PRNGKey(0), std=0.2)
    w = (seg != 0).astype(jnp.float32)[..., None]
    left = jnp.asarray(np.arange(T)[None] >= np.array([[4], [8], [0]]))   # prefill's prompts are left-padded
    prompt_pos = jnp.maximum(jnp.cumsum(left, axis=1) - 1, 0)

    def run(cfg):
        loss = lambda p: jnp.sum(jax.nn.log_softmax(forward(cfg, p, tokens, pos, seg)) * w)
        val, grads = jax.jit(jax.value_and_grad(loss))(params)
        logits, cache = jax.jit(lambda p: prefill(cfg, p, tokens, prompt_pos, left, init_cache(cfg, 3, 16)))(params)
        return val, grads, logits, cache

    ref = run(CFG)
    with tpu_attention.interpret_mode():
        got = run(CFG.replace(attention_impl="splash"))
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5)
    # each leaf to 1e-5 of its largest entry (the loss sums 3 x 12 x 97 log-probs: gradients reach 180)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5 * np.abs(b).max()), got[1], ref[1])
    np.testing.assert_allclose(got[2], ref[2], atol=1e-5)    # prefill: logits of the last column
    assert (got[3]["valid"] == ref[3]["valid"]).all() and got[3]["index"] == ref[3]["index"] == T
    held = np.asarray(ref[3]["valid"])[:, None, :, None]        # padding slots are never read
    for a, b in zip(got[3]["k"] + got[3]["v"], ref[3]["k"] + ref[3]["v"]):
        np.testing.assert_allclose(np.where(held, a, 0), np.where(held, b, 0), atol=1e-5)


def test_splash_is_refused_off_tpu_outside_interpret_mode_and_auto_keeps_this_backend():
    assert "splash" in ATTENTION_IMPLS
    cfg = CFG.replace(attention_impl="splash")
    if jax.default_backend() != "tpu":
        with pytest.raises(ValueError, match="attention_impl='splash' needs a TPU backend"):
            resolve_attention_impl(cfg)
    with tpu_attention.interpret_mode():
        assert resolve_attention_impl(cfg) == "splash"
    assert not tpu_attention.interpreting()
    expected = {"tpu": "splash", "gpu": "xla"}.get(jax.default_backend(), "xla")   # fp32 compute: no cuDNN
    if jax.default_backend() != "tpu" or tpu_attention.splash_fits():
        assert resolve_attention_impl(CFG.replace(attention_impl="auto")) == expected
    default = {"cpu": 64, "tpu": tpu_attention.DECODE_CACHE_BLOCK}.get(jax.default_backend(), 0)
    assert cache_block(CFG, 8 * max(default, 1)) == default   # decode: the filled-window XLA path where chosen


@pytest.mark.parametrize("T,padded,block", [(1, 128, 128), (128, 128, 128), (129, 256, 256), (300, 384, 128),
                                            (700, 768, 256), (1000, 1024, 512)])
def test_sequence_padded_to_lane_multiple_and_largest_block_that_divides_it(T, padded, block):
    assert tpu_attention.padded_length(T) == padded
    assert tpu_attention.block_size(padded) == block


MESH_SCRIPT = r'''
import json
import jax, jax.numpy as jnp, numpy as np
from jaxrag.models import tpu_attention
from jaxrag.models.transformer import attention, attention_mask
from jaxrag.sharding import make_mesh
T = 128
seg = jnp.asarray(np.array([[1] * 100 + [0] * 28, [0] * 28 + [1] * 100, [1] * 50 + [2] * 78, [1] * T], np.int32))
kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 3)
q, k, v = jax.random.normal(kq, (4, T, 4, 8)), jax.random.normal(kk, (4, T, 2, 8)), jax.random.normal(kv, (4, T, 2, 8))
w = (seg != 0).astype(jnp.float32)[..., None, None]
loss = lambda fn: jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v, seg)) * w), argnums=(0, 1, 2)))
ref_val, ref_grads = loss(lambda q, k, v, s: attention(q, k, v, attention_mask(s), "highest"))(q, k, v)
with tpu_attention.interpret_mode(), jax.set_mesh(make_mesh((2, 1, 2))):
    split = "shard_map" in str(jax.make_jaxpr(tpu_attention.splash_attention)(q, k, v, seg))
    out = jax.jit(tpu_attention.splash_attention)(q, k, v, seg)
    val, grads = loss(tpu_attention.splash_attention)(q, k, v)
print(json.dumps({"split": split, "spec": str(out.sharding.spec), "dval": float(abs(val - ref_val)),
                  "dgrad": max(float(jnp.abs(a - b).max()) for a, b in zip(grads, ref_grads))}))
'''


def test_splash_under_a_mesh_runs_per_shard_and_equals_xla(tmp_path):
    """With a mesh in context (4 fake CPU devices: data 2 x tensor 2) the kernel runs under shard_map, batch split
    over data and heads over tensor (GQA: each shard's query heads read its own kv heads); values and gradients
    equal the XLA path's. A subprocess: the fake devices must be set before jax initialises."""
    import json, os, subprocess, sys
    from pathlib import Path
    script = tmp_path / "mesh.py"
    script.write_text(MESH_SCRIPT)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["split"] and got["spec"] == "P('data', None, 'tensor')"
    assert got["dval"] < 1e-3 and got["dgrad"] < 5e-5, got
