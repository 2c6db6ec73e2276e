"""JaxPolicy.generate's sampling: n samples per prompt through one shared prefill, equal to the replicate path."""

from fakes import ByteTokenizer, tiny_jax_policy

from jaxrag.sampling import JaxPolicy


def test_n_samples_share_one_prefill_and_equal_the_replicate_path():
    shared = tiny_jax_policy()
    replicate = JaxPolicy(shared.cfg, shared.params, ByteTokenizer(), share_prefix=False)
    prompts = ["question: who directed the film", "question: where"]
    kw = dict(n=4, temperature=1.0, max_new_tokens=10, stop=["\n"], seed=7)
    a, b = shared.generate(prompts, **kw), replicate.generate(prompts, **kw)
    assert [len(r) for r in a] == [4, 4]
    for row_a, row_b in zip(a, b):
        for x, y in zip(row_a, row_b):
            assert (x.text, x.token_ids, x.finish_reason, x.prompt_ids) == (y.text, y.token_ids, y.finish_reason, y.prompt_ids)
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-4   # cascade vs copies: rounding
    # 2 distinct prompts (2 rows) vs 8 replicated rows, same padded length: a quarter of the prefill
    assert shared.prefill_tokens * 4 == replicate.prefill_tokens
    assert isinstance(shared._sample_params["layers"], tuple)  # decode reads per-layer weight buffers
    assert not isinstance(shared.params["layers"], tuple)  # the trainer's stacked layout is what `params` gives


def test_one_token_stop_strings_end_rows_on_device_with_the_same_results():
    pol = tiny_jax_policy(3)
    prompts = ["question: who directed the film", "question: where"]
    free = pol.generate(prompts, max_new_tokens=24, temperature=1.0, seed=1)
    ascii_after = lambda text, i: next(c for c in text[i:] if ord(c) < 128)
    stop = [ascii_after(free[0][0].text, 2), ascii_after(free[1][0].text, 3), "no such stop", "\u00e9"]
    # one-byte stops found inside the samples are device stop ids; a two-byte character and a long string are not
    assert pol.stop_token_ids(stop) == tuple(sorted({pol.tokenizer.encode(s)[0] for s in stop[:2]}))
    out = {}
    for device in (False, True):
        pol.device_stops, slots = device, pol.decode_slots
        out[device] = (pol.generate(prompts, max_new_tokens=24, temperature=1.0, seed=1, stop=stop),
                       pol.decode_slots - slots)
    for x, y in zip(out[False][0], out[True][0]):
        x, y = x[0], y[0]
        assert (x.token_ids, x.logprobs, x.finish_reason) == (y.token_ids, y.logprobs, y.finish_reason)
    assert [o[0].finish_reason for o in out[True][0]] == ["stop", "stop"]
    assert out[True][1] < out[False][1] == 2 * 16   # the host check alone runs a whole 16-step chunk
