"""JaxPolicy.generate's sampling: n samples per prompt through one shared prefill, equal to the replicate path."""

from fakes import ByteTokenizer, tiny_jax_policy

from jaxrag.policy import JaxPolicy


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
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-5
    # 2 distinct prompts (2 rows) vs 8 replicated rows, same padded length: a quarter of the prefill
    assert shared.prefill_tokens * 4 == replicate.prefill_tokens
    assert isinstance(shared._sample_params["layers"], tuple)  # decode reads per-layer weight buffers
    assert not isinstance(shared.params["layers"], tuple)  # the trainer's stacked layout is what `params` gives
