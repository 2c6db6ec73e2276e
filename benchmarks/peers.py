"""The sampler's own speed, the peer every rollout bench is measured against: decode (`pure_decode`) and cached
prefill (`pure_prefill`) with no engine, host or retrieval around them. Used by benchmarks.rollout and benchmarks.rollout_kv
(a module of its own so neither imports the other)."""
from __future__ import annotations

import dataclasses
import time

from benchmarks.common import durations


def pure_decode(pol, states: int, new_tokens: int, repeats: int = 3, context: int = 0, n: int = 1,
                temperature: float = 0.0) -> float:
    """New tokens/s of the JaxPolicy's sampler decoding `new_tokens` in n rows for each of `states` distinct prompts
    (no EOS, no stop: every row runs to the end), the fastest of `repeats` runs after a warm-up: a rollout's decode
    batch, `states` x n rows, each state's rows reading its own prompt (distinct prompts: identical ones would be
    prefilled once and read once by every row of the batch, a sharing no rollout has). The prompts are one token,
    or with `context` > 0 that many and only the decode is timed (Completions.timing["decode_s"]): the decoder's own
    speed over a rollout's context, its prefill left out. temperature: the rollout's (a draw per row and step)."""
    import jax

    from jaxrag.sampling import SamplingParams, sample

    cfg = dataclasses.replace(pol.cfg, eos_ids=())
    sp = SamplingParams(temperature=temperature, max_new_tokens=new_tokens)
    V = cfg.vocab_size - 3
    prompts = [[3 + (s * 7919 + i) % V for i in range(max(context, 1))] for s in range(states)]
    if context:
        prompts = [[cfg.bos_id] + p[1:] for p in prompts]
    run = lambda: sample(cfg, pol._sample_params, prompts, sp, jax.random.PRNGKey(0), n=n)
    run()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = run()
        best = min(best, out.timing["decode_s"] if context else time.perf_counter() - t0)
    return float(out.lengths.sum()) / best


def pure_prefill(pol, batch: int, appended: int, held: int, repeats: int = 3) -> float:
    """Prompt tokens/s of the model's cached forward alone: `batch` rows each run `appended` new tokens against a
    cache already holding `held` valid ones (no padding, no bucket), then the last column's logits: the prefill
    work a rollout that keeps its KV cache between turns cannot avoid, without the pool's gathers and copies.
    The fastest of `repeats` runs after a warm-up."""
    import jax
    import jax.numpy as jnp

    from jaxrag.models.transformer import forward_cached_hidden, init_cache, logits_from_hidden

    cfg, A = pol.cfg, max(appended, 1)
    cache = init_cache(cfg, batch, held + A)
    cache = dict(cache, valid=cache["valid"].at[:, :held].set(True), index=jnp.asarray(held, jnp.int32))
    tokens = jnp.asarray([[3 + (r + i) % (cfg.vocab_size - 3) for i in range(A)] for r in range(batch)], jnp.int32)
    positions = jnp.broadcast_to(held + jnp.arange(A, dtype=jnp.int32), (batch, A))
    valid = jnp.ones((batch, A), bool)

    @jax.jit
    def run(params, cache):
        hidden, cache = forward_cached_hidden(cfg, params, tokens, positions, valid, cache)
        return logits_from_hidden(cfg, params, hidden[:, -1]), cache

    step = lambda: jax.block_until_ready(run(pol._sample_params, cache))
    step()
    return batch * A / min(durations(step, repeats))
