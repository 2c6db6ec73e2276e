"""KV-cache decode: prefill + per-layer in-place cache updates equal the full-sequence model, for stacked and
unstacked layer weights, a bf16 cache, and attention over the whole cache or over its filled window in blocks."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrag.models import ModelConfig, decode_step, forward, init_cache, init_params, prefill, unstack_layers
from jaxrag.models.config import ConfigError
from jaxrag.models.transformer import attend, attend_window, cache_block, layer_params

CFG = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, max_seq_len=64)
PARAMS = init_params(CFG, jax.random.PRNGKey(0), std=0.3)
SEQS = [[5, 9, 11, 3, 40, 41, 7, 8, 90, 2], [1, 2, 3, 4, 5, 6], [17, 18, 19, 20, 21, 22, 23, 24]]  # ragged
PROMPT = 4  # each row's first PROMPT tokens are prefilled (left-padded), the rest decoded one at a time
step = jax.jit(decode_step, static_argnums=0, donate_argnums=4)
prefill_jit = jax.jit(prefill, static_argnums=0, donate_argnums=5)


def _cached_logits(cfg, params, cache_dtype=None, extra=0):
    """Per row: the logits after each decoded token (teacher-forced with SEQS), from prefill + decode_step, in a cache
    of `extra` slots more than the 12 it needs."""
    P = 6  # padded prompt length
    tokens = np.zeros((3, P), np.int32)
    valid = np.zeros((3, P), bool)
    for i, s in enumerate(SEQS):
        tokens[i, P - PROMPT:], valid[i, P - PROMPT:] = s[:PROMPT], True
    positions = np.maximum(np.cumsum(valid, 1) - 1, 0).astype(np.int32)
    cache = init_cache(cfg, 3, P + 6 + extra, dtype=cache_dtype)
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


# the whole cache at once; or its filled window (12 slots of 40 or 48) in blocks of 2, 5 (the last one clamped), 6
@pytest.mark.parametrize("block,extra", [(0, 0), (2, 36), (5, 28), (6, 36)])
def test_prefill_and_decode_equal_the_full_sequence_for_stacked_and_unstacked_layers(block, extra):
    ref = _reference()
    cfg = CFG.replace(cache_block=block)
    stacked, _ = _cached_logits(cfg, PARAMS, extra=extra)
    _compare(stacked, ref, 1e-5)
    unstacked, cache = _cached_logits(cfg, unstack_layers(PARAMS), extra=extra)
    _compare(unstacked, ref, 1e-5)
    assert len(cache["k"]) == CFG.n_layers and cache["k"][0].shape == (3, 2, 12 + extra, 8)  # per layer [B,K,S,Dh]
    assert int(cache["index"]) == 6 + 5


def test_unstacked_params_are_the_same_model():
    unstacked = unstack_layers(PARAMS)
    assert isinstance(unstacked["layers"], tuple) and len(unstacked["layers"]) == 2
    for i in range(2):
        jax.tree.map(np.testing.assert_array_equal, layer_params(unstacked, i), layer_params(PARAMS, i))
    tokens = jnp.asarray([SEQS[0]])
    np.testing.assert_allclose(forward(CFG, unstacked, tokens), forward(CFG, PARAMS, tokens), atol=1e-5)
    assert unstack_layers(unstacked) is unstacked


@pytest.mark.parametrize("block", [0, 2])
def test_decode_updates_each_layer_cache_buffer_in_place(block):
    params, cfg = unstack_layers(PARAMS), CFG.replace(cache_block=block)
    cache = init_cache(cfg, 3, 16)
    tok = jnp.zeros((3,), jnp.int32)
    logits, cache = step(cfg, params, tok, tok, cache)  # the first call may allocate
    before = [b.unsafe_buffer_pointer() for b in cache["k"] + cache["v"]]
    _, after = step(cfg, params, tok, tok + 1, cache)
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


def _window_case(T, S=23, B=3, K=2, G=2, Dh=8, seed=0):
    """q for T new tokens at slots [S-T-4, S-4) of an S-slot cache whose rows hold ragged spans: row 0 slots
    [9, ...), row 1 [11, ...) with a hole, row 2 nothing before its new tokens (lo = 9)."""
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(B, T, K * G, Dh)), jnp.float32)
    k = rng.normal(size=(B, K, S, Dh)).astype(np.float32)
    v = rng.normal(size=(B, K, S, Dh)).astype(np.float32)
    start = S - T - 4
    valid = np.zeros((B, S), bool)
    valid[0, 9:start + T] = True
    valid[1, 11:start + T] = True
    valid[1, 14:16] = False
    valid[2, start:start + T] = True
    query_slots = start + jnp.arange(T)
    mask = (np.arange(S)[None, :] <= np.asarray(query_slots)[:, None])[None] & valid[:, None, :]
    return q, k, v, valid, query_slots, jnp.asarray(mask)


@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("block", [1, 4, 7, 16, 23])
def test_window_attention_equals_attention_over_the_whole_cache(T, block):
    q, k, v, valid, query_slots, mask = _window_case(T)
    ref = attend(q, jnp.asarray(k), jnp.asarray(v), mask, "highest")
    lo = jnp.argmax(jnp.any(jnp.asarray(valid), axis=0))
    assert int(lo) == 9
    got = attend_window(q, jnp.asarray(k), jnp.asarray(v), jnp.asarray(valid), query_slots, lo, block, "highest")
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-6)
    # a bf16 cache: the same rounding as the one-pass path
    kb, vb = jnp.asarray(k, jnp.bfloat16), jnp.asarray(v, jnp.bfloat16)
    np.testing.assert_allclose(attend_window(q, kb, vb, jnp.asarray(valid), query_slots, lo, block),
                               attend(q, kb, vb, mask), rtol=0, atol=2e-2)


def test_window_attention_reads_only_the_blocks_of_the_filled_window():
    """NaN in every slot outside the window's blocks: the one-pass path reads them (0 x NaN in its probs @ v), the
    window path never does and gives the values of a clean cache. Block 4: the window [9, 20) is blocks [8, 20)."""
    q, k, v, valid, query_slots, mask = _window_case(1)
    ref = attend_window(q, jnp.asarray(k), jnp.asarray(v), jnp.asarray(valid), query_slots, jnp.asarray(9), 4)
    k[:, :, :8], v[:, :, :8], k[:, :, 20:], v[:, :, 20:] = np.nan, np.nan, np.nan, np.nan
    k, v = jnp.asarray(k), jnp.asarray(v)
    assert np.isnan(np.asarray(attend(q, k, v, mask))).all()
    got = attend_window(q, k, v, jnp.asarray(valid), query_slots, jnp.asarray(9), 4)
    np.testing.assert_array_equal(got, ref)


def test_a_row_with_nothing_to_attend_to_gets_zeros():
    q, k, v, valid, query_slots, _ = _window_case(1)
    valid[2] = False
    got = attend_window(q, jnp.asarray(k), jnp.asarray(v), jnp.asarray(valid), query_slots, jnp.asarray(9), 4)
    assert np.all(np.isfinite(np.asarray(got))) and not np.asarray(got[2]).any()


def test_decode_reads_the_window_while_it_is_at_most_half_the_cache():
    """A decode step over a 64-slot cache, blocks of 4, NaN keys/values in every slot past the window's blocks:
    while the rows hold few tokens the step reads only the window (finite logits, those of a clean cache); once the
    window's blocks pass half the cache it reads every slot (one pass: NaN), as cache_block 0 always does."""
    params = unstack_layers(PARAMS)
    B, S = 3, 64

    def step_logits(cfg, filled, poison):
        cache = init_cache(cfg, B, S)
        lim = -(-(filled + 1) // 4) * 4   # the end of the window's last block
        cache["k"] = tuple(b.at[:, :, lim:].set(jnp.nan if poison else 0.0) for b in cache["k"])
        cache["v"] = tuple(b.at[:, :, lim:].set(jnp.nan if poison else 0.0) for b in cache["v"])
        cache["valid"] = cache["valid"].at[:, :filled].set(True)
        cache["index"] = jnp.asarray(filled, jnp.int32)
        tok = jnp.asarray([5, 9, 11], jnp.int32)
        return np.asarray(step(cfg, params, tok, jnp.full((B,), filled, jnp.int32), cache)[0])

    windowed = CFG.replace(cache_block=4)
    for filled in (3, 20, 31):   # windows of 4, 24 and 32 slots: at most half of 64
        got = step_logits(windowed, filled, poison=True)
        np.testing.assert_allclose(got, step_logits(CFG.replace(cache_block=0), filled, poison=False), atol=1e-5)
        assert np.isnan(step_logits(CFG.replace(cache_block=0), filled, poison=True)).all()
    assert np.isnan(step_logits(windowed, 32, poison=True)).all()   # a 36-slot window: one pass


def test_cache_block_by_config_and_backend():
    assert cache_block(CFG.replace(cache_block=0), 1024) == 0
    assert cache_block(CFG.replace(cache_block=64), 1024) == 64
    assert cache_block(CFG.replace(cache_block=64), 511) == 0   # fewer than 8 blocks: always one pass
    assert cache_block(CFG, 1024) == (64 if jax.default_backend() == "cpu" else 0)
    with pytest.raises(ConfigError, match="cache_block=-1"):
        CFG.replace(cache_block=-1)
