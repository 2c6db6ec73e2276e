"""Sampler behaviour: determinism, sampling filters, stop ids/strings, finish reasons, ragged prompts, bucketing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrag.models import ModelConfig, forward, init_cache, init_params
from jaxrag.sampling.generate import (SamplingParams, _filter_logits, _pick, _prefill, bucket, decode, draw, fork,
                                      left_pad, sample)

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, max_seq_len=128)
PARAMS = init_params(CFG, jax.random.PRNGKey(0), std=0.5)  # large std: peaked, varied distributions
PROMPTS = [[1, 5, 9], [1, 7, 3, 3, 12, 40, 2, 8], [1, 20]]


class CharTokenizer:
    """id i <-> chr(ord('a') + i % 26): enough to test stop strings."""
    eos_ids = ()

    def decode(self, ids):
        return "".join(chr(ord("a") + int(i) % 26) for i in ids)


def test_deterministic_for_a_key_and_different_across_keys():
    sp = SamplingParams(temperature=1.0, max_new_tokens=12)
    a = sample(CFG, PARAMS, PROMPTS, sp, jax.random.PRNGKey(1))
    b = sample(CFG, PARAMS, PROMPTS, sp, jax.random.PRNGKey(1))
    c = sample(CFG, PARAMS, PROMPTS, sp, jax.random.PRNGKey(2))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert not np.array_equal(a.tokens, c.tokens)


def test_top_k_1_is_greedy_and_logprobs_are_the_models():
    greedy = sample(CFG, PARAMS, PROMPTS, SamplingParams(max_new_tokens=10), jax.random.PRNGKey(0))
    topk1 = sample(CFG, PARAMS, PROMPTS, SamplingParams(temperature=1.0, top_k=1, max_new_tokens=10), jax.random.PRNGKey(5))
    np.testing.assert_array_equal(greedy.tokens, topk1.tokens)
    # the recorded log-probs are the full-sequence model's log-softmax at each generated token
    seq = PROMPTS[1] + greedy.tokens[1].tolist()
    logits = np.asarray(forward(CFG, PARAMS, np.array([seq])))[0]
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
    want = [logp[len(PROMPTS[1]) - 1 + t, tok] for t, tok in enumerate(greedy.tokens[1])]
    np.testing.assert_allclose(greedy.logprobs[1], want, atol=1e-4)


def test_filters_keep_exactly_the_top_k_and_nucleus():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], np.float32))
    k2 = np.asarray(_filter_logits(logits, 1.0, 2, 1.0))
    assert np.isfinite(k2[0]).tolist() == [True, True, False, False]
    p = np.asarray(_filter_logits(logits, 1.0, 0, 0.7))  # 0.5 < 0.7, 0.5+0.3 >= 0.7 -> keep 2
    assert np.isfinite(p[0]).tolist() == [True, True, False, False]
    p = np.asarray(_filter_logits(logits, 1.0, 0, 0.85))
    assert np.isfinite(p[0]).tolist() == [True, True, True, False]


def test_draws_follow_the_filtered_softmax():
    """`draw` (an exponential race on hashed uniforms) against softmax(logits / T) after top-k / top-p, over 40,000
    keys: every frequency within 4 standard errors of its probability, excluded tokens (top-k, nucleus, -inf) never
    drawn, the first and last ids included; one key gives one token whatever the batch around it; and the hashed
    noise is uniform over 1,000 ids (chi-square)."""
    logits = np.log(np.array([0.02, 0.40, 1e-3, 0.25, 0.08, 1.0, 0.15, 0.099], np.float32))
    logits[5] = -np.inf                                                                          # id 5: excluded
    n = 40_000
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(7), i))(jnp.arange(n))
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.8)]:
        sp = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
        toks = np.asarray(_pick(jnp.broadcast_to(jnp.asarray(logits), (n, 8)), keys, sp))
        kept = np.asarray(_filter_logits(logits[None], temperature, top_k, top_p))[0]
        prob = np.exp(kept - kept.max()) / np.exp(kept - kept.max()).sum()
        freq = np.bincount(toks, minlength=8) / n
        assert np.all(np.abs(freq - prob) <= 4 * np.sqrt(prob * (1 - prob) / n) + 1e-9), (temperature, top_k, freq)
        assert np.all(freq[prob == 0] == 0)
    edge = np.full((2, 6), -np.inf, np.float32)
    edge[0, 0], edge[1, 5] = 0.0, 0.0           # all the mass on the first id, on the last id
    assert np.asarray(draw(keys[:2], jnp.asarray(edge))).tolist() == [0, 5]
    one = np.asarray(draw(keys[:1], jnp.asarray(logits[None])))
    assert one[0] == np.asarray(draw(keys[:64], jnp.broadcast_to(jnp.asarray(logits), (64, 8))))[0]
    wide = np.asarray(draw(keys, jnp.zeros((n, 1000))))          # uniform over 1,000 ids: every id, about n / 1,000
    counts = np.bincount(wide, minlength=1000)
    chi2 = ((counts - n / 1000) ** 2 / (n / 1000)).sum()
    assert counts.min() > 0 and chi2 < 1000 + 5 * np.sqrt(2 * 1000), chi2  # 999 dof: mean 999, sd 44.7


def test_draws_do_not_move_with_float_rounding():
    """Two paths whose logits differ by float rounding (cascade vs copied prefix, pool vs lock-step) must draw the
    same tokens from the same keys: a 1e-5 perturbation of 1,024 logits moves no draw of 20,000 (the race moves only
    on a near-tie of its top two; an inverse-CDF draw moved about 1 in 800 here)."""
    n, V = 20_000, 1024
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(10), i))(jnp.arange(n))
    logits = jnp.broadcast_to(jax.random.normal(jax.random.PRNGKey(0), (V,)) * 3, (n, V))
    nudged = logits + 1e-5 * jax.random.normal(jax.random.PRNGKey(100), (n, V))
    assert int(jnp.sum(draw(keys, logits) != draw(keys, nudged))) <= 2


def test_eos_and_stop_ids_end_rows_with_reasons():
    free = sample(CFG, PARAMS, PROMPTS, SamplingParams(max_new_tokens=10), jax.random.PRNGKey(0))
    first = int(free.tokens[0, 3])  # make row 0's 4th generated token an EOS
    cfg = CFG.replace(eos_ids=(first,))
    out = sample(cfg, PARAMS, PROMPTS, SamplingParams(max_new_tokens=10), jax.random.PRNGKey(0))
    n0 = list(free.tokens[0]).index(first) + 1
    assert out.lengths[0] == n0 and out.finish_reason[0] == "eos"
    assert out.tokens[0, n0:].sum() == 0 and out.logprobs[0, n0:].sum() == 0
    out = sample(CFG, PARAMS, PROMPTS, SamplingParams(max_new_tokens=10, stop_ids=(first,)), jax.random.PRNGKey(0))
    assert out.lengths[0] == n0 and out.finish_reason[0] == "stop"
    for i in range(1, 3):
        if first not in free.tokens[i].tolist():
            assert out.finish_reason[i] == "length" and out.lengths[i] == 10


def test_stop_strings_cut_at_the_completing_token():
    tok = CharTokenizer()
    free = sample(CFG, PARAMS, PROMPTS, SamplingParams(max_new_tokens=24), jax.random.PRNGKey(0))
    text = tok.decode(free.tokens[2])
    stop = text[9:11]  # a 2-char string first completed somewhere after position 10
    first = text.find(stop) + 2
    out = sample(CFG, PARAMS, PROMPTS, SamplingParams(max_new_tokens=24), jax.random.PRNGKey(0),
                 stop_strings=[stop], tokenizer=tok, chunk=4)
    assert out.finish_reason[2] == "stop" and out.lengths[2] == first
    assert tok.decode(out.tokens[2, : out.lengths[2]]).endswith(stop)
    np.testing.assert_array_equal(out.tokens[2, :first], free.tokens[2, :first])


def test_ragged_prompts_match_one_by_one_and_batch_is_bucketed():
    sp = SamplingParams(max_new_tokens=8)
    batch = sample(CFG, PARAMS, PROMPTS, sp, jax.random.PRNGKey(0))
    for i, p in enumerate(PROMPTS):
        alone = sample(CFG, PARAMS, [p], sp, jax.random.PRNGKey(0))
        np.testing.assert_array_equal(alone.tokens[0], batch.tokens[i])
    assert [bucket(n, 1) for n in (1, 3, 4, 5, 9)] == [1, 4, 4, 8, 16]


def test_bad_requests_fail_clearly():
    with pytest.raises(ValueError, match="at least one token"):
        sample(CFG, PARAMS, [[1], []], SamplingParams(), jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="exceeds max_seq_len=128"):
        sample(CFG, PARAMS, [[1] * 100], SamplingParams(max_new_tokens=64), jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="n=0; need n >= 1"):
        sample(CFG, PARAMS, [[1]], SamplingParams(), jax.random.PRNGKey(0), n=0)
    with pytest.raises(ValueError, match="need a tokenizer"):
        sample(CFG, PARAMS, [[1]], SamplingParams(), jax.random.PRNGKey(0), stop_strings=["x"])
    assert sample(CFG, PARAMS, [], SamplingParams(), jax.random.PRNGKey(0)).tokens.shape[0] == 0


def test_a_decode_past_its_cache_fails_instead_of_overwriting_the_last_slot():
    """A cache with room for 3 of 8 new tokens: the decode stops at its last slot and says so (a step past it would
    have its dynamic_update_slice start clamped and overwrite that slot silently); with room for all 8 it runs."""
    tokens, positions, valid = (jnp.asarray(a) for a in left_pad([[1, 5, 9, 4]], 1, 4))
    for room, fits in ((3, False), (8, True)):
        logits, cache = _prefill(CFG, PARAMS, tokens, positions, valid, init_cache(CFG, 1, 4 + room))
        run = lambda: decode(CFG, PARAMS, cache, logits, valid.sum(1).astype(jnp.int32), 1,
                             SamplingParams(max_new_tokens=8), jax.random.PRNGKey(0))
        if fits:
            out, cache = run()
            assert out.lengths.tolist() == [8] and int(cache["index"]) == 12
        else:
            with pytest.raises(ValueError, match="7 slots are full after 3 of 8 new tokens"):
                run()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_prefix_sampling_equals_replicate_and_prefill(temperature):
    sp = SamplingParams(temperature=temperature, max_new_tokens=8)
    prompts = PROMPTS + [PROMPTS[0]]  # a repeated prompt shares its prefill too
    shared = sample(CFG, PARAMS, prompts, sp, jax.random.PRNGKey(3), n=3)
    replicated = sample(CFG, PARAMS, [p for p in prompts for _ in range(3)], sp, jax.random.PRNGKey(3), share_prefix=False)
    np.testing.assert_array_equal(shared.tokens, replicated.tokens)
    np.testing.assert_allclose(shared.logprobs, replicated.logprobs, atol=1e-4)   # rounding, as other path tests
    np.testing.assert_array_equal(shared.lengths, replicated.lengths)
    assert shared.finish_reason == replicated.finish_reason
    # 3 distinct prompts (bucket 4 rows) x 16 slots prefilled, against 12 rows (bucket 16) x 16
    assert (shared.prefill_tokens, replicated.prefill_tokens) == (4 * 16, 16 * 16)
    if temperature > 0:  # each row draws from its own key: a prompt's samples differ
        assert len({tuple(shared.tokens[i]) for i in range(3)}) > 1
    else:  # greedy: the repeated prompt's rows are its first occurrence's
        np.testing.assert_array_equal(shared.tokens[9:12], shared.tokens[0:3])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shape_floors_pad_the_batch_without_changing_samples(temperature):
    """min_rows / min_prompt (the tiny pipeline's few compiled programs): padding rows and prompt columns change
    neither tokens (each row keeps its key) nor log-probs beyond float rounding; prefill_tokens counts the padding."""
    sp = SamplingParams(temperature=temperature, max_new_tokens=6)
    plain = sample(CFG, PARAMS, PROMPTS, sp, jax.random.PRNGKey(5), n=2)
    floored = sample(CFG, PARAMS, PROMPTS, sp, jax.random.PRNGKey(5), n=2, min_rows=16, min_prompt=64)
    np.testing.assert_array_equal(floored.tokens, plain.tokens)
    np.testing.assert_allclose(floored.logprobs, plain.logprobs, atol=1e-5)
    assert floored.finish_reason == plain.finish_reason
    # 3 distinct prompts: 4 prefill rows x 16 columns, floored to 16 rows x 64 columns; decode rows 8 -> 16
    assert (plain.prefill_tokens, floored.prefill_tokens) == (4 * 16, 16 * 64)
    assert floored.decode_slots == 2 * plain.decode_slots
    # the prompt floor is capped where the prompt + new tokens would pass max_seq_len (128 - 6 = 122 columns)
    capped = sample(CFG, PARAMS, PROMPTS, sp, jax.random.PRNGKey(5), min_prompt=256)
    assert capped.prefill_tokens == 4 * 122
    np.testing.assert_array_equal(capped.tokens, sample(CFG, PARAMS, PROMPTS, sp, jax.random.PRNGKey(5)).tokens)
    with pytest.raises(ValueError, match="min_rows=0"):
        sample(CFG, PARAMS, PROMPTS, sp, jax.random.PRNGKey(5), min_rows=0)


def test_a_row_sample_does_not_depend_on_the_batch_around_it():
    sp = SamplingParams(temperature=1.0, max_new_tokens=6)
    batch = sample(CFG, PARAMS, PROMPTS, sp, jax.random.PRNGKey(4))
    head = sample(CFG, PARAMS, PROMPTS[:1], sp, jax.random.PRNGKey(4))  # row 0 alone: another padded batch size
    np.testing.assert_array_equal(head.tokens[0], batch.tokens[0])


def test_fork_gathers_cache_rows_on_device():
    cache = init_cache(CFG, 2, 4)
    cache = {**cache, "k": tuple(k.at[1].set(1.0) for k in cache["k"]), "valid": cache["valid"].at[1, :2].set(True),
             "index": jnp.asarray(2, jnp.int32)}
    forked = fork(cache, [1, 1, 0])
    assert forked["k"][0].shape[0] == 3 and int(forked["index"]) == 2
    for layer in range(CFG.n_layers):
        np.testing.assert_array_equal(np.asarray(forked["k"][layer])[:, 0, 0, 0], [1.0, 1.0, 0.0])
    np.testing.assert_array_equal(np.asarray(forked["valid"])[:, 0], [True, True, False])


def test_decode_on_mesh_placed_params_compiles_one_chunk_program():
    """The RL sampler decodes with the trainer's mesh-placed params: the first chunk (fresh state arrays) and the later
    ones (the previous chunk's outputs) must run the same compiled program, with the unsharded path's tokens."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxrag import sharding as shd
    from jaxrag.sampling.generate import _decode_chunk

    mesh = shd.make_mesh((1, 1, 1), jax.devices()[:1])
    placed = jax.tree.map(lambda a: jax.device_put(a, NamedSharding(mesh, P(*[None] * a.ndim))), PARAMS)
    sp = SamplingParams(temperature=1.0, max_new_tokens=12)
    kw = dict(stop_strings=["qqqqqqqq"], tokenizer=CharTokenizer(), chunk=4)  # 3 chunks of 4 steps
    before = _decode_chunk._cache_size()
    on_mesh = [sample(CFG, placed, PROMPTS, sp, jax.random.PRNGKey(k), **kw) for k in (6, 7)]
    assert _decode_chunk._cache_size() - before == 1
    plain = sample(CFG, PARAMS, PROMPTS, sp, jax.random.PRNGKey(7), **kw)
    np.testing.assert_array_equal(on_mesh[1].tokens, plain.tokens)
    assert on_mesh[1].lengths.max() == 12  # it did decode past the first chunk
