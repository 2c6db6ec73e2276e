"""Attention implementations: the fused-attention call (jax.nn.dot_product_attention) with jaxrag's mask plumbing
equals jaxrag's own attention on every mask the model uses (causal, left/right padding, packed segments, GQA).

On CPU the fused call runs with implementation="xla"; the cudnn kernel itself is checked only where a GPU is."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrag.models import ConfigError, ModelConfig, forward, init_params
from jaxrag.models.transformer import (attention, attention_mask, block_causal_attention, causal_blocks,
                                      fused_attention, resolve_attention_impl)

CFG = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, max_seq_len=64)
T = 12


# One row per mask the model meets: right padding (7 of 12), left padding (4 of 12), packing (5+4+2, then pad).
SEG = np.array([[1] * 7 + [0] * 5, [0] * 8 + [1] * 4, [1] * 5 + [2] * 4 + [3] * 2 + [0]], np.int32)
# the position of each token inside its own segment (what packing and left padding feed RoPE)
POS = np.array([list(range(7)) + [0] * 5, [0] * 8 + list(range(4)), list(range(5)) + list(range(4)) + [0, 1, 0]], np.int32)
REAL = SEG != 0


@pytest.mark.parametrize("heads", [(4, 2), (4, 4), (4, 1)])  # GQA, MHA, MQA
def test_fused_attention_equals_xla_attention_on_every_mask(heads):
    H, K = heads
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(kq, (3, T, H, 8))
    k = jax.random.normal(kk, (3, T, K, 8))
    v = jax.random.normal(kv, (3, T, K, 8))
    ours = jax.jit(lambda q, k, v, seg: attention(q, k, v, attention_mask(seg), "highest"))
    fused = jax.jit(lambda q, k, v, seg: fused_attention(q, k, v, seg, "xla", "highest"))
    got = np.asarray(fused(q, k, v, jnp.asarray(SEG)))
    np.testing.assert_allclose(got[REAL], np.asarray(ours(q, k, v, jnp.asarray(SEG)))[REAL], atol=1e-5)
    assert np.isfinite(got).all()  # padding rows too: none is fully masked
    # no segment ids: plain causal over the whole row
    causal = jax.jit(lambda q, k, v: fused_attention(q, k, v, None, "xla", "highest"))(q, k, v)
    np.testing.assert_allclose(causal, ours(q, k, v, jnp.ones((3, T), jnp.int32)), atol=1e-5)


@pytest.mark.parametrize("n_blocks", [2, 3, 4, 6])
def test_block_causal_attention_equals_full_attention_values_and_gradients(n_blocks):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(1), 3)
    q, k, v = jax.random.normal(kq, (3, T, 4, 8)), jax.random.normal(kk, (3, T, 2, 8)), jax.random.normal(kv, (3, T, 2, 8))
    mask = attention_mask(jnp.asarray(SEG))
    w = jnp.asarray(REAL, jnp.float32)[..., None, None]  # padding rows' outputs are never read

    def run(fn):
        return jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v)) * w), argnums=(0, 1, 2)))(q, k, v)

    full = run(lambda q, k, v: attention(q, k, v, mask, "highest"))
    blocked = run(lambda q, k, v: block_causal_attention(q, k, v, mask, "highest", n_blocks))
    np.testing.assert_allclose(blocked[0], full[0], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), blocked[1], full[1])
    out = block_causal_attention(q, k, v, mask, "highest", n_blocks)
    np.testing.assert_allclose(np.asarray(out)[REAL], np.asarray(attention(q, k, v, mask, "highest"))[REAL], atol=1e-5)


def test_causal_blocks_at_most_4_of_32_tokens_or_more():
    assert [causal_blocks(t) for t in (12, 32, 64, 100, 128, 192, 256, 320, 4096)] == [1, 1, 2, 2, 4, 4, 4, 4, 4]


def test_model_through_the_fused_path_equals_the_xla_path_values_and_gradients():
    params = init_params(CFG, jax.random.PRNGKey(0), std=0.2)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, T), 3, 97)
    seg, pos = jnp.asarray(SEG), jnp.asarray(POS)

    @functools.partial(jax.jit, static_argnums=1)
    def loss_and_grad(p, impl):
        def loss(p):
            logits = forward(CFG.replace(attention_impl=impl), p, tokens, pos, seg)
            return jnp.sum(jnp.where(seg[..., None] != 0, jax.nn.log_softmax(logits), 0.0)[..., 5]), logits
        return jax.value_and_grad(loss, has_aux=True)(p)

    (l_x, logits_x), g_x = loss_and_grad(params, "xla")
    (l_f, logits_f), g_f = loss_and_grad(params, "dpa_xla")
    np.testing.assert_allclose(np.asarray(logits_f)[REAL], np.asarray(logits_x)[REAL], atol=1e-5)
    np.testing.assert_allclose(l_f, l_x, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), g_f, g_x)


def test_implementation_is_chosen_by_config_and_backend():
    backend = jax.default_backend()
    bf16 = CFG.replace(dtype="bfloat16")
    assert resolve_attention_impl(CFG) == "xla"  # fp32 compute: cuDNN flash attention does not take it
    assert resolve_attention_impl(bf16) == ("cudnn" if backend == "gpu" else "xla")
    assert resolve_attention_impl(CFG.replace(attention_impl="dpa_xla")) == "dpa_xla"
    if backend != "gpu":
        with pytest.raises(ValueError, match=f"needs a GPU backend \\(found '{backend}'\\)"):
            resolve_attention_impl(bf16.replace(attention_impl="cudnn"))
    with pytest.raises(ValueError, match="dtype='float32'"):
        resolve_attention_impl(CFG.replace(attention_impl="cudnn"))
    with pytest.raises(ConfigError, match="attention_impl='flash'"):
        CFG.replace(attention_impl="flash")


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN flash attention needs a GPU")
def test_cudnn_model_matches_xla_in_bf16():
    cfg = ModelConfig(vocab_size=97, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128,
                      max_seq_len=64, dtype="bfloat16")
    params = init_params(cfg, jax.random.PRNGKey(0), std=0.2)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, T), 3, 97)
    seg, pos = jnp.asarray(SEG), jnp.asarray(POS)
    ref = forward(cfg.replace(attention_impl="xla"), params, tokens, pos, seg)
    got = forward(cfg.replace(attention_impl="cudnn"), params, tokens, pos, seg)
    err = np.abs(np.asarray(got)[REAL] - np.asarray(ref)[REAL]).max()
    assert err < 0.05 * np.abs(np.asarray(ref)).max()
