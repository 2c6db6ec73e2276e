"""KV-cache decode: prefill + per-layer in-place cache updates equal the full-sequence model, for stacked and
unstacked layer weights and a bf16 cache."""


import jax
import jax.numpy as jnp
import numpy as np

from jaxrag.models import ModelConfig, decode_step, forward, init_cache, init_params, prefill, unstack_layers
from jaxrag.models.transformer import layer_params

CFG = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, max_seq_len=64)
PARAMS = init_params(CFG, jax.random.PRNGKey(0), std=0.3)
SEQS = [[5, 9, 11, 3, 40, 41, 7, 8, 90, 2], [1, 2, 3, 4, 5, 6], [17, 18, 19, 20, 21, 22, 23, 24]]  # ragged
PROMPT = 4  # each row's first PROMPT tokens are prefilled (left-padded), the rest decoded one at a time
step = jax.jit(decode_step, static_argnums=0, donate_argnums=4)
prefill_jit = jax.jit(prefill, static_argnums=0, donate_argnums=5)


def _cached_logits(cfg, params, cache_dtype=None):
    """Per row: the logits after each decoded token (teacher-forced with SEQS), from prefill + decode_step."""
    P = 6  # padded prompt length
    tokens = np.zeros((3, P), np.int32)
    valid = np.zeros((3, P), bool)
    for i, s in enumerate(SEQS):
        tokens[i, P - PROMPT:], valid[i, P - PROMPT:] = s[:PROMPT], True
    positions = np.maximum(np.cumsum(valid, 1) - 1, 0).astype(np.int32)
    cache = init_cache(cfg, 3, P + 6, dtype=cache_dtype)
    logits, cache = prefill_jit(cfg, params, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(valid), cache)
    out = [np.asarray(logits)]
    for t in range(5):
        tok = np.array([s[PROMPT + t] if PROMPT + t < len(s) else 0 for s in SEQS], np.int32)
        logits, cache = step(cfg, params, jnp.asarray(tok), jnp.full((3,), PROMPT + t, jnp.int32), cache)
        out.append(np.asarray(logits))
    return np.stack(out, 1), cache  # [3, 6, V]: logits at sequence positions PROMPT-1 .. PROMPT+4


def _reference():
    ref = np.zeros((3, 6, CFG.vocab_size), np.float32)
    for i, s in enumerate(SEQS):
        full = np.asarray(forward(CFG, PARAMS, jnp.asarray([s])))[0]
        n = min(6, len(s) - PROMPT + 1)
        ref[i, :n] = full[PROMPT - 1: PROMPT - 1 + n]
    return ref


def _compare(got, ref, atol):
    for i, s in enumerate(SEQS):
        n = min(6, len(s) - PROMPT + 1)
        np.testing.assert_allclose(got[i, :n], ref[i, :n], atol=atol)


def test_prefill_and_decode_equal_the_full_sequence_for_stacked_and_unstacked_layers():
    ref = _reference()
    stacked, _ = _cached_logits(CFG, PARAMS)
    _compare(stacked, ref, 1e-5)
    unstacked, cache = _cached_logits(CFG, unstack_layers(PARAMS))
    _compare(unstacked, ref, 1e-5)
    assert len(cache["k"]) == CFG.n_layers and cache["k"][0].shape == (3, 2, 12, 8)  # per layer [B,K,S,Dh]
    assert int(cache["index"]) == 6 + 5


def test_unstacked_params_are_the_same_model():
    unstacked = unstack_layers(PARAMS)
    assert isinstance(unstacked["layers"], tuple) and len(unstacked["layers"]) == 2
    for i in range(2):
        jax.tree.map(np.testing.assert_array_equal, layer_params(unstacked, i), layer_params(PARAMS, i))
    tokens = jnp.asarray([SEQS[0]])
    np.testing.assert_allclose(forward(CFG, unstacked, tokens), forward(CFG, PARAMS, tokens), atol=1e-5)
    assert unstack_layers(unstacked) is unstacked


def test_decode_updates_each_layer_cache_buffer_in_place():
    params = unstack_layers(PARAMS)
    cache = init_cache(CFG, 3, 16)
    tok = jnp.zeros((3,), jnp.int32)
    logits, cache = step(CFG, params, tok, tok, cache)  # the first call may allocate
    before = [b.unsafe_buffer_pointer() for b in cache["k"] + cache["v"]]
    _, after = step(CFG, params, tok, tok + 1, cache)
    assert all(b.is_deleted() for b in cache["k"] + cache["v"])  # donated
    assert [b.unsafe_buffer_pointer() for b in after["k"] + after["v"]] == before  # written where it lies


def test_bf16_cache_stays_close_and_is_stored_in_bf16():
    ref = _reference()
    got, cache = _cached_logits(CFG, unstack_layers(PARAMS), cache_dtype="bfloat16")
    assert all(b.dtype == jnp.bfloat16 for b in cache["k"] + cache["v"])
    scale = np.abs(ref).max()
    _compare(got, ref, 0.02 * scale)
    cfg_bf16 = CFG.replace(cache_dtype="bfloat16")
    assert init_cache(cfg_bf16, 1, 4)["v"][1].dtype == jnp.bfloat16


def test_scanned_and_unrolled_stacked_layers_are_the_same_model_values_and_gradients():
    # ModelConfig.scan_layers: lax.scan over the stacked leaves, or an unrolled loop over their jnp.split slices
    # (the GPU default), whose gradient is one concatenate per leaf, not a sum of zero-padded slices
    tokens = jnp.asarray([SEQS[0], SEQS[0][::-1]])
    weights = jax.random.normal(jax.random.PRNGKey(4), (2, 10, CFG.vocab_size))

    def loss(params, scan):
        return jnp.sum(forward(CFG.replace(scan_layers=scan), params, tokens) * weights)

    want, g_want = jax.value_and_grad(loss)(PARAMS, True)
    got, g_got = jax.value_and_grad(loss)(PARAMS, False)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4), g_got, g_want)
    hlo = jax.jit(jax.grad(loss), static_argnums=1).lower(PARAMS, False).as_text()
    assert "while" not in hlo and "stablehlo.pad" not in hlo and "concatenate" in hlo
    assert "while" in jax.jit(jax.grad(loss), static_argnums=1).lower(PARAMS, True).as_text()
