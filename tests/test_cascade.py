"""Cascade attention: decode rows that continue a shared prompt read its keys/values once per group (no copy per
row), with the results of attention over the row's own copy of the prompt."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.model import bytes_accessed
from jaxrag.models import ModelConfig, decode_step, init_cache, init_params, unstack_layers
from jaxrag.models.transformer import attend, attend_shared
from jaxrag.sampling.generate import SamplingParams, _fork, _prefill, cascade_cache, cascade_groups, left_pad, sample

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, max_seq_len=512)
PARAMS = init_params(CFG, jax.random.PRNGKey(0), std=0.5)
PROMPTS = [[1, 5, 9], [1, 7, 3, 3, 12, 40, 2, 8], [1, 20]]


def _shared_case(T, U=3, m=2, P=11, S=7, K=2, G=2, Dh=8, seed=0):
    """U prefixes of P slots (ragged, one with a hole), each continued by m rows whose own S slots hold ragged
    spans; T new tokens at own slots [S-T-1, S-1). Returns the cascade's inputs and the same rows with their
    prefix copied in front of their own slots (what a fork by copy attends to)."""
    rng = np.random.default_rng(seed)
    B = U * m
    q = jnp.asarray(rng.normal(size=(B, T, K * G, Dh)), jnp.float32)
    pk, pv = (rng.normal(size=(U, K, P, Dh)).astype(np.float32) for _ in range(2))
    k, v = (rng.normal(size=(B, K, S, Dh)).astype(np.float32) for _ in range(2))
    pvalid = np.zeros((U, P), bool)
    pvalid[0, 2:] = True
    pvalid[1, 5:] = True
    pvalid[1, 7] = False
    pvalid[2, :] = True
    start = S - T - 1
    valid = np.zeros((B, S), bool)
    for r in range(B):
        valid[r, r % 3:start + T] = True
    query = start + np.arange(T)
    own_mask = (np.arange(S)[None, :] <= query[:, None])[None] & valid[:, None, :]   # [B,T,S]
    group = np.arange(B) // m
    full_k = np.concatenate([pk[group], k], axis=2)
    full_v = np.concatenate([pv[group], v], axis=2)
    full_mask = np.concatenate([np.broadcast_to(pvalid[group][:, None, :], (B, T, P)), own_mask], axis=2)
    shared = (q, jnp.asarray(k), jnp.asarray(v), jnp.asarray(own_mask), jnp.asarray(pk), jnp.asarray(pv),
              jnp.asarray(pvalid))
    return shared, (q, jnp.asarray(full_k), jnp.asarray(full_v), jnp.asarray(full_mask))


@pytest.mark.parametrize("T", [1, 3])
def test_shared_attention_equals_attention_over_the_copied_prefix(T):
    shared, copied = _shared_case(T)
    np.testing.assert_allclose(attend_shared(*shared, "highest"), attend(*copied, "highest"), rtol=0, atol=2e-6)
    q, k, v, mask, pk, pv, pvalid = shared
    bf = lambda a: a.astype(jnp.bfloat16)
    np.testing.assert_allclose(attend_shared(q, bf(k), bf(v), mask, bf(pk), bf(pv), pvalid),
                               attend(copied[0], bf(copied[1]), bf(copied[2]), copied[3]), rtol=0, atol=2e-2)


def test_a_row_with_nothing_valid_in_either_part_gets_zeros():
    (q, k, v, mask, pk, pv, pvalid), _ = _shared_case(1)
    mask, pvalid = mask.at[4:].set(False), pvalid.at[2].set(False)   # rows 4, 5 (prefix 2): nothing at all
    got = np.asarray(attend_shared(q, k, v, mask, pk, pv, pvalid))
    assert np.isfinite(got).all() and not got[4:].any() and got[:4].any()


def test_cascade_groups_are_equal_contiguous_runs_or_nothing():
    assert cascade_groups([0, 1, 2], 3) == 3
    assert cascade_groups([0, 0, 1, 1], 2) == 4    # each prompt twice in a row, 2 samples each
    assert cascade_groups([0, 1, 0], 2) == 0       # a repeat elsewhere: fork by copying
    assert cascade_groups([0, 0, 1], 2) == 0       # unequal groups


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("prompts,n", [(PROMPTS, 3), ([PROMPTS[1], PROMPTS[1], PROMPTS[0], PROMPTS[0]], 2)])
def test_cascade_sampling_equals_the_copied_fork_and_replicate_and_prefill(temperature, prompts, n):
    """Rows end at different steps (a stop id chosen from a probe run so that they do); each row keeps its own key,
    so the same samples at T = 1."""
    key = jax.random.PRNGKey(3)
    probe = sample(CFG, PARAMS, prompts, SamplingParams(temperature=temperature, max_new_tokens=10), key, n=n,
                   min_rows=8).tokens.tolist()
    ends = lambda t: {row.index(t) if t in row else 10 for row in probe}
    stop = next(t for t in probe[0] if len(ends(t)) > 1)
    sp = SamplingParams(temperature=temperature, max_new_tokens=10, stop_ids=(stop,))
    cascade = sample(CFG, PARAMS, prompts, sp, key, n=n, min_rows=8)
    copied = sample(CFG, PARAMS, prompts, sp, key, n=n, min_rows=8, cascade=False)
    replicated = sample(CFG, PARAMS, [p for p in prompts for _ in range(n)], sp, key, share_prefix=False, min_rows=8)
    for other in (copied, replicated):
        np.testing.assert_array_equal(cascade.tokens, other.tokens)
        np.testing.assert_allclose(cascade.logprobs, other.logprobs, atol=1e-5)
        np.testing.assert_array_equal(cascade.lengths, other.lengths)
        assert cascade.finish_reason == other.finish_reason
    assert len(set(cascade.lengths.tolist())) > 1 and cascade.prefill_tokens == copied.prefill_tokens


def test_a_decode_step_reads_each_prompt_once_per_group():
    """2 prompts of 256 tokens, 4 rows each: the cascade cache holds each prompt once (U rows, P slots) and XLA's
    bytes accessed for one decode step are under half those of the copied fork's ([8, 256 + 8] slots), with the
    same logits."""
    params = unstack_layers(PARAMS)
    U, m, P, new = 2, 4, 256, 8
    rng = np.random.default_rng(1)
    tokens, positions, valid = left_pad([rng.integers(1, 64, P - 3).tolist(), rng.integers(1, 64, P).tolist()], U, P)
    tokens, positions, valid = jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(valid)
    logits, prompt_cache = _prefill(CFG, params, tokens, positions, valid, init_cache(CFG, U, P))
    position = valid.sum(1).astype(jnp.int32)
    _, pos, shared = cascade_cache(CFG, prompt_cache, logits, position, m, new)
    assert shared["prefix"]["k"][0].shape == (U, 2, P, 8) and shared["k"][0].shape == (U * m, 2, new, 8)
    _, full = _prefill(CFG, params, tokens, positions, valid, init_cache(CFG, U, P + new))
    _, forked, _ = _fork((logits, full, position), np.repeat(np.arange(U), m))
    step = jax.jit(decode_step, static_argnums=0)
    tok = jnp.arange(U * m, dtype=jnp.int32) + 1
    got, want = step(CFG, params, tok, pos, shared)[0], step(CFG, params, tok, pos, forked)[0]
    np.testing.assert_allclose(got, want, atol=1e-4)
    cost = lambda cache: bytes_accessed(step.lower(CFG, params, tok, pos, cache).compile())
    assert cost(shared) < 0.5 * cost(forked)
