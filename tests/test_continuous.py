"""Continuous batching (sampling.continuous + RolloutConfig(continuous=True)): a slot pool smaller than the work gives
the lock-step sampler's tokens per request / per episode, keys that do not depend on the slots, bounded memory."""
import collections
import copy
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fakes import (ByteTokenizer, EchoSearch, Latin1Tokenizer, OverlapRetriever, Passage, ScriptedPolicy,
                   SlotScripted)
from rl_world import PASSAGES, QUESTIONS, EchoAgent, HashRetriever
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import ANSWER, Action, Episode
from jaxrag.env.rollout import RolloutConfig, rollout
from jaxrag.models.config import ModelConfig
from jaxrag.models.transformer import init_cache, param_shapes
from jaxrag.sampling import JaxPolicy, RequestTooLong, SlotPool, extends, shared_prefix
from jaxrag.sampling.generate import SamplingParams, _decode_chunk, bucket, row_keys, sample


@pytest.fixture(scope="module")
def pol():
    """tests/fakes.tiny_jax_policy's model (1 layer, d_model 32, std 0.5) with numpy-drawn weights: no jitted
    initializer to compile per weight shape."""
    cfg = ModelConfig(vocab_size=259, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                      max_seq_len=64, bos_id=1, eos_ids=(2,), pad_id=0)
    rng = np.random.default_rng(0)
    make = lambda name, shape: (np.ones(shape, np.float32) if "norm" in name
                                else rng.normal(0, 0.5, shape).astype(np.float32))
    shapes = param_shapes(cfg)
    params = {n: make(n, sh) for n, sh in shapes.items() if n != "layers"}
    params["layers"] = {n: make(n, sh) for n, sh in shapes["layers"].items()}
    return JaxPolicy(cfg, jax.tree.map(jnp.asarray, params), ByteTokenizer())


def _prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [[1] + rng.integers(3, 250, size=int(k)).tolist() for k in rng.integers(10, 40, size=n)]


def _drain(pool):
    got = {}
    while pool.busy:
        for f in pool.step():
            assert f.rid not in got
            got[f.rid] = f
    return got


@pytest.mark.parametrize("block", [None, 8])   # the pool's cache read whole (108 slots), or its filled window
def test_slot_pool_equals_lockstep_sampler_with_reused_slots_and_stop_strings(pol, block):
    cfg, params, tok = pol.cfg, pol._sample_params, pol.tokenizer
    prompts = _prompts(7)
    sp = SamplingParams(max_new_tokens=20)
    probe = sample(cfg, params, prompts, sp, jax.random.PRNGKey(0), tokenizer=tok, chunk=16)   # ref's shapes
    # a stop string (a printable byte) that some rows generate and others do not: ragged finishes
    rows = [set(probe.row(i)[0]) for i in range(len(prompts))]
    t = next(t for t in range(35, 130) if 2 <= sum(t in r for r in rows) <= len(rows) - 2)
    stop = [tok.decode([t])]
    ref = sample(cfg, params, prompts, sp, jax.random.PRNGKey(0), stop_strings=stop, tokenizer=tok)
    assert len(set(ref.lengths.tolist())) > 1 and "stop" in ref.finish_reason and "length" in ref.finish_reason
    # 2 slots for 7 requests (slots reused), a pool short enough that the cache is shifted both ways
    pool = SlotPool(cfg.replace(cache_block=block), params, 2, 100, sp, jax.random.PRNGKey(0), stop_strings=stop,
                    tokenizer=tok, chunk=8)
    for i, p in enumerate(prompts):
        pool.submit(i, p, (i, 0))
    got = _drain(pool)
    assert pool.stats["shifts_left"] >= 1 and pool.stats["shifts_right"] >= 1 and pool.stats["finished"] == 7
    for i in range(len(prompts)):
        ids, logps = ref.row(i)
        assert got[i].tokens == ids and got[i].finish_reason == ref.finish_reason[i] and got[i].prompt_ids == prompts[i]
        np.testing.assert_allclose(got[i].logprobs, logps, rtol=0, atol=1e-4)   # other shapes: float rounding
    # every kept token was a busy slot-step (tokens past a host stop-string cut too); the rest idled
    assert sum(len(f.tokens) for f in got.values()) <= pool.stats["busy_steps"] < pool.stats["slot_steps"]
    assert 0 <= pool.idle_share < 1


def test_collect_counts_the_inserts_device_time_as_insert_time(pol):
    """launch dispatches the inserts without waiting; collect waits for the last `place` output first (the device
    runs the inserts before the chunk) and counts that as insert_s, the rest of its wait as decode_s."""
    prompts = _prompts(3)
    pool = SlotPool(pol.cfg, pol._sample_params, 4, 64, SamplingParams(max_new_tokens=4), jax.random.PRNGKey(0))
    for i, p in enumerate(prompts + prompts[:1]):   # 3 distinct prompts, one shared: prefill groups of 2 and 1
        pool.submit(i, p, (i, 0))
    assert pool.launch() and pool.stats["inserts"] == 2
    assert pool.placed is pool.keys   # the last group's output (the first group's keys were donated to the second)
    before = dict(pool.timing)
    pool.collect()
    assert pool.placed is None
    assert pool.timing["insert_s"] > before["insert_s"] and pool.timing["decode_s"] > before["decode_s"]
    ins = pool.timing["insert_s"]
    while pool.busy:   # no more inserts: nothing more counts as insert time
        pool.step()
    assert pool.timing["insert_s"] == ins and pool.placed is None


def test_identical_prompts_share_one_prefill_with_the_lockstep_tokens(pol):
    cfg, params = pol.cfg, pol._sample_params
    a, b = _prompts(2, seed=3)
    sp = SamplingParams(max_new_tokens=12)
    ref = sample(cfg, params, [a, b], sp, jax.random.PRNGKey(0))
    pool = SlotPool(cfg, params, 4, 100, sp, jax.random.PRNGKey(0))   # room for a whole bucket
    for i, p in enumerate([a, b, a, a]):
        pool.submit(i, p, (i, 0))
    got = _drain(pool)
    for i, p in enumerate([a, b, a, a]):
        assert got[i].tokens == ref.row(0 if p == a else 1)[0]
    # two distinct prompts prefilled (one group of 2 x their bucket), not four
    assert pool.stats["prefill_tokens"] == 2 * bucket(max(len(a), len(b)), 16) and pool.stats["inserts"] == 1
    assert pool.stats["prefill_shared"] == 2


def test_a_shared_prefill_does_not_change_a_sample(pol):
    cfg, params = pol.cfg, pol._sample_params
    a, b = _prompts(2, seed=4)
    sp = SamplingParams(max_new_tokens=12, temperature=1.0)
    alone = SlotPool(cfg, params, 4, 64, sp, jax.random.PRNGKey(3))
    alone.submit("x", a, (5, 1))
    ref = _drain(alone)["x"]
    # with a duplicate of another fold and another prompt: 3 slot rows from 2 prefill rows (one padding row dropped)
    pool = SlotPool(cfg, params, 4, 64, sp, jax.random.PRNGKey(3))
    for rid, p, fold in [("y", a, (7, 0)), ("x", a, (5, 1)), ("z", b, (5, 2))]:
        pool.submit(rid, p, fold)
    got = _drain(pool)
    assert pool.stats["prefill_shared"] == 1 and alone.stats["prefill_shared"] == 0
    assert got["x"].tokens == ref.tokens and got["y"].tokens != ref.tokens   # the fold, not the prefill row, keys it
    np.testing.assert_allclose(got["x"].logprobs, ref.logprobs, rtol=0, atol=1e-4)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_pool_of_shared_prefixes_samples_as_the_copying_pool(pol, temperature):
    """SlotPool(group=3): a prompt's requests fill the 3 slots of a group and read the prompt once, from the group's
    prefix row; the rows' own slots hold only their new tokens. Requests of a prompt more than a group holds take a
    second group, fewer leave slots empty; 13 requests through 2 groups reuse them. Same tokens as the pool whose
    slots each hold a copy (keys fold per request), and at T = 0 the lock-step sampler's; half the memory."""
    cfg, params, tok = pol.cfg, pol._sample_params, pol.tokenizer
    prompts, counts = _prompts(5, seed=7), [3, 4, 2, 3, 1]
    sp = SamplingParams(max_new_tokens=20, temperature=temperature)
    ref = sample(cfg, params, prompts, sp, jax.random.PRNGKey(0), tokenizer=tok)

    def run(group, stop):
        pool = SlotPool(cfg, params, 6, 100, sp, jax.random.PRNGKey(0), stop_strings=stop, tokenizer=tok, chunk=8,
                        group=group)
        for i, (p, c) in enumerate(zip(prompts, counts)):
            for j in range(c):
                pool.submit((i, j), p, (10 * i + j, 0))
        return pool, _drain(pool)

    # a stop string some requests meet and some that run to the length do not: rows of one group finish apart
    probe = run(1, None)[1].values()
    t = next(t for t in range(35, 130) if 1 <= sum(t in f.tokens for f in probe) <= 6
             and any(t not in f.tokens and f.finish_reason == "length" for f in probe))
    stop = [tok.decode([t])]
    ref = sample(cfg, params, prompts, sp, jax.random.PRNGKey(0), stop_strings=stop, tokenizer=tok)
    got, nbytes = {}, {}
    for group in (1, 3):
        pool, got[group] = run(group, stop)
        assert pool.stats["finished"] == sum(counts)
        if group == 3:
            assert [a.shape for a in (pool.cache["valid"], pool.cache["prefix"]["valid"])] == [(6, 28), (2, 80)]
            assert pool.stats["shifts_left"] >= 1 and "shifts_right" not in pool.stats
            # one prefill a prompt per insert: prompt 1's fourth request waits for a free group, prefilled again
            assert pool.stats["prefill_shared"] == sum(counts) - len(prompts) - 1
        nbytes[group] = pool.nbytes
    assert nbytes[3] * 6 * 108 == nbytes[1] * (6 * 28 + 2 * 80)   # key/value slots: 328 instead of 648
    for i, c in enumerate(counts):
        for j in range(c):
            a, b = got[1][(i, j)], got[3][(i, j)]
            assert (b.tokens, b.finish_reason, b.prompt_ids) == (a.tokens, a.finish_reason, prompts[i])
            np.testing.assert_allclose(b.logprobs, a.logprobs, rtol=0, atol=1e-4)
            if temperature == 0:
                assert b.tokens == ref.row(i)[0] and b.finish_reason == ref.finish_reason[i]
    assert {f.finish_reason for f in got[3].values()} >= {"stop", "length"}


def test_a_chunk_ends_once_enough_rows_or_whole_groups_are_done(pol):
    """The pool's decode chunk hands back once state["exit_done"] rows are done, or, in a cache with a prefix
    (groups of m rows continuing one prefix row), once that many WHOLE groups are: a group's slots take new work only
    when all m are free, so a row done beside live ones frees nothing. Rows here reach max_new_tokens (8) after
    1, 5, 2 and 2 steps; groups of 2 are rows (0, 1) and (2, 3)."""
    cfg, params, n_max, B = pol.cfg, pol._sample_params, 8, 4

    def steps(exit_done, groups):
        cache = init_cache(cfg, B, 24)
        if groups:
            cache["prefix"] = {k: v for k, v in init_cache(cfg, B // 2, 16).items() if k != "index"}
        state = {"logits": jnp.zeros((B, cfg.vocab_size)), "tokens": jnp.zeros((B, n_max), jnp.int32),
                 "logprobs": jnp.zeros((B, n_max)), "lengths": jnp.asarray([7, 3, 6, 6], jnp.int32),
                 "position": jnp.zeros((B,), jnp.int32), "done": jnp.zeros((B,), bool),
                 "stopped": jnp.zeros((B,), bool), "t": jnp.zeros((), jnp.int32),
                 "exit_done": jnp.asarray(exit_done, jnp.int32)}
        _, out = _decode_chunk(cfg, SamplingParams(max_new_tokens=n_max), 16, params, cache, state,
                               jnp.asarray([-1], jnp.int32), row_keys(jax.random.PRNGKey(0), B))
        return int(out["t"])

    assert [steps(e, groups=False) for e in (1, 3, 4)] == [1, 2, 5]    # rows: row 0, then rows 2 and 3, then row 1
    assert [steps(e, groups=True) for e in (1, 2)] == [2, 5]           # groups: (2, 3) first, (0, 1) with row 1
    # the pool sets the threshold in its own unit: a quarter of its 8 rows, or of its 2 groups of 4 (at least one)
    sp = SamplingParams(max_new_tokens=8)
    assert [SlotPool(cfg, params, 8, 64, sp, jax.random.PRNGKey(0), group=g).refill for g in (1, 4)] == [2, 1]


def test_a_pool_of_shared_prefixes_refuses_what_it_cannot_hold(pol):
    sp = SamplingParams(max_new_tokens=8)
    with pytest.raises(ValueError, match="slots \\(5\\) must be a multiple of the group"):
        SlotPool(pol.cfg, pol._sample_params, 5, 64, sp, jax.random.PRNGKey(0), group=2)
    with pytest.raises(ValueError, match="prefix_cache=True needs group=1"):
        SlotPool(pol.cfg, pol._sample_params, 4, 64, sp, jax.random.PRNGKey(0), group=2, sessions=True,
                 prefix_cache=True)
    # the policy falls back to copies where the pool cannot group
    make = lambda slots: pol.continuous(slots, max_new_tokens=8, group=2).pool.group
    assert make(4) == 2 and make(5) == 1
    pol.cascade = False
    try:
        assert make(4) == 1
    finally:
        pol.cascade = True


def test_too_long_request_and_bad_pool_are_clear_errors(pol):
    sp = SamplingParams(max_new_tokens=16)
    pool = SlotPool(pol.cfg, pol._sample_params, 2, 40, sp, jax.random.PRNGKey(0), setting="JaxPolicy(pool_tokens=...)")
    with pytest.raises(RequestTooLong,
                       match=r"30 prompt \+ 16 new tokens .* 40 tokens per slot; raise JaxPolicy\(pool_tokens"):
        pool.submit("r", [1] * 30, (0, 0))
    pool.submit("ok", [1] * 24, (0, 0))    # exactly fits
    assert pool.busy == 1
    with pytest.raises(RequestTooLong, match="max_new_tokens=16 leaves no room"):
        SlotPool(pol.cfg, pol._sample_params, 2, 16, sp, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="slots=0"):
        SlotPool(pol.cfg, pol._sample_params, 0, 64, sp, jax.random.PRNGKey(0))
    # through the policy and the engine: the policy's setting is named
    pol.pool_tokens = 20
    try:
        with pytest.raises(RequestTooLong, match=r"raise JaxPolicy\(pool_tokens=...\)"):
            rollout(pol, HashRetriever(PASSAGES), EchoAgent(mode="plain"), QUESTIONS[:1],
                    RolloutConfig(k=1, max_new_tokens=12, continuous=True))
    finally:
        pol.pool_tokens = pol.cfg.max_seq_len


def _episodes(policy, batch, n=6, answer_char="4", select=None, agent=None, **kw):
    cfg = RolloutConfig(k=1, batch_size=batch, max_steps=4, max_new_tokens=12, **kw)
    st = {}
    agent = agent or EchoAgent(answer_char=answer_char, mode="plain")
    eps = rollout(policy, HashRetriever(PASSAGES), agent, QUESTIONS[:n], cfg, stats=st, select=select)
    return eps, st


def _same_episodes(a, b, atol):
    assert [len(e.steps) for e in a] == [len(e.steps) for e in b]
    for ea, eb in zip(a, b):
        assert (ea.qid, ea.done, ea.answer) == (eb.qid, eb.done, eb.answer)
        for sa, sb in zip(ea.steps, eb.steps):
            assert sa.action == sb.action and sa.token_ids == sb.token_ids and sa.prompt == sb.prompt
            assert sa.prompt_ids == sb.prompt_ids and sa.finish_reason == sb.finish_reason
            assert [d.doc_id for d in sa.docs] == [d.doc_id for d in sb.docs]
            np.testing.assert_allclose(sa.logprobs, sb.logprobs, rtol=0, atol=atol)


def test_continuous_rollout_equals_lockstep_at_temperature_zero(pol):
    lock, _ = _episodes(pol, 2)
    assert len({len(e.steps) for e in lock}) > 1            # episodes of different lengths
    cont, st = _episodes(pol, 2, continuous=True)            # 2 slots for 6 episodes: slots reused
    _same_episodes(lock, cont, atol=1e-4)
    assert st["generations"] == sum(len(e.steps) for e in lock) and 0 <= st["idle_slot_share"] < 1
    over, _ = _episodes(pol, 2, continuous=True, overlap=True)   # host work during the next chunk: same episodes
    _same_episodes(lock, over, atol=1e-4)


def test_continuous_samples_do_not_depend_on_the_batch(pol):
    a, _ = _episodes(pol, 2, 4, continuous=True, temperature=1.0, seed=5)
    b, _ = _episodes(pol, 4, 4, continuous=True, temperature=1.0, seed=5)
    _same_episodes(a, b, atol=1e-4)
    c, _ = _episodes(pol, 2, 4, continuous=True, temperature=1.0, seed=6)
    assert [s.token_ids for e in a for s in e.steps] != [s.token_ids for e in c for s in e.steps]


def _pools(pol):
    """Record the SlotPools `pol.continuous` builds (an instance attribute over the method; `del` restores it)."""
    pools, make = [], pol.continuous
    pol.continuous = lambda *a, **kw: pools.append(make(*a, **kw)) or pools[-1]
    return pools


def test_continuous_candidates_equal_lockstep_at_temperature_zero(pol):
    picked = []

    def last(states, cands):   # the last candidate; each state is checked against its candidates' prompt
        assert all(s.question in pol.tokenizer.decode(c.completion.prompt_ids) for s, cs in zip(states, cands)
                   for c in cs)
        picked.extend(len(cs) for cs in cands)
        return [len(cs) - 1 for cs in cands]

    lock, _ = _episodes(pol, 2, n_candidates=3, select=last)
    pools = _pools(pol)
    try:
        cont, st = _episodes(pol, 2, continuous=True, n_candidates=3, select=last)
    finally:
        del pol.continuous
    _same_episodes(lock, cont, atol=1e-4)
    turns = sum(len(e.steps) for e in lock)
    assert all(len(s.candidates) == 2 for e in cont for s in e.steps) and picked == [3] * (2 * turns)
    assert st["generations"] == 3 * turns
    # 2 episodes x 3 candidates of slots in groups of 3; each turn's prompt prefilled once, read by its 3 candidates
    assert pools[0].pool.slots == 6 and pools[0].pool.stats["prefill_shared"] == 2 * turns
    assert pools[0].pool.group == 3 and "prefix" in pools[0].pool.cache


def test_continuous_candidates_at_temperature_one_pick_the_selected_row(pol):
    def largest(states, cands):   # the lexicographically largest token ids (any candidate index)
        return [max(range(len(cs)), key=lambda j: (list(cs[j].completion.token_ids), j)) for cs in cands]

    a, st = _episodes(pol, 2, 4, continuous=True, temperature=1.0, seed=5, n_candidates=3, select=largest)
    steps = [s for e in a for s in e.steps]
    assert st["generations"] == 3 * len(steps)
    assert all(len(s.candidates) == 2 and all(s.token_ids >= c["token_ids"] for c in s.candidates) for s in steps)
    assert sum(s.token_ids != c["token_ids"] for s in steps for c in s.candidates) > len(steps)   # they differ
    b, _ = _episodes(pol, 4, 4, continuous=True, temperature=1.0, seed=5, n_candidates=3, select=largest)
    _same_episodes(a, b, atol=1e-4)                                                  # not the batch


def test_scripted_policy_candidates_and_summaries_keep_the_lockstep_path():
    pol = ScriptedPolicy(lambda p, j: "go" if len(pol.calls) == 1 else "~done")   # search, then answer
    eps = rollout(pol, HashRetriever(PASSAGES), EchoAgent(mode="plain"), QUESTIONS[:3],
                  RolloutConfig(k=1, batch_size=3, continuous=True))
    assert len(pol.calls) == 2 and [len(c["prompts"]) for c in pol.calls] == [3, 3]   # one call per engine step
    assert all(len(e.steps) == 2 for e in eps)
    # a policy with the protocol goes lock-step for an agent that summarizes; n candidates go through its pool
    for agent, n in [("react", 2), ("search_o1", 1)]:
        slot = SlotScripted(lambda p, j: "search: fact\n" if "search" not in p.split("?", 1)[-1] else "answer: x\n")
        eps = rollout(slot, HashRetriever(PASSAGES), get_agent(agent, mode="plain"), QUESTIONS[:2],
                      RolloutConfig(k=1, batch_size=2, n_candidates=n, continuous=True))
        assert all(e.done for e in eps)
        if n == 1:
            assert slot.calls and not hasattr(slot, "session")
        else:
            assert not slot.calls and slot.session.most == 4 and all(len(s.candidates) == 1 for e in eps
                                                                       for s in e.steps)


@pytest.mark.parametrize("agent, overlap, n", [("react", False, 1), ("rag", True, 1), ("react", True, 2)])
def test_engine_over_the_continuous_protocol_equals_lockstep(agent, overlap, n):
    """Turns finishing out of order, RAG's scripted first search, refill: the same episodes as the lock-step engine."""
    def respond(prompt, j):
        n = prompt.count("search: ")
        return f"search: fact {n}\n" if n < len(prompt.split("?")[0]) % 4 else "answer: x\n"

    questions = [{"id": f"q{i}", "question": f"question {'n' * i}?", "golden_answers": ["x"]} for i in range(7)]
    ret = OverlapRetriever([Passage(f"p{i}", f"T{i}", f"fact {i}") for i in range(9)])
    lock = rollout(ScriptedPolicy(respond), ret, get_agent(agent, mode="plain"), questions,
                   RolloutConfig(k=2, batch_size=3, n_candidates=n))
    pol = SlotScripted(respond)
    st = {}
    cont = rollout(pol, ret, get_agent(agent, mode="plain"), questions,
                   RolloutConfig(k=2, batch_size=3, n_candidates=n, continuous=True, overlap=overlap), stats=st)
    assert not pol.calls and pol.session.most == 3 * n and not pol.session.busy   # all through the pool, slots full
    if agent == "react":
        assert len({len(e.steps) for e in lock}) > 1              # episodes of different lengths
    else:
        assert all(e.steps[0].prompt == "" and e.steps[0].action.extra.get("scripted") for e in cont)   # RAG's search
    view = lambda eps: [(e.qid, e.done, e.answer, e.reward, [(s.action, s.prompt, [d.doc_id for d in s.docs],
                                                              len(s.candidates))
                                                            for s in e.steps]) for e in eps]
    assert view(cont) == view(lock)
    assert st["generations"] == n * sum(1 for e in lock for s in e.steps if s.prompt)


# ---- sessions: a finished request's row stays parked; the session's next request prefills only what it appends ----
class RawEcho(EchoSearch):
    """EchoSearch (its prompt holds each raw generation, then its documents: a prefix extension at token level under
    Latin1Tokenizer) whose generation answers when it holds `answer_char`: episodes of different lengths."""
    answer_char = "4"

    def parse_plain(self, text):
        return Action(ANSWER, text[:16], text) if self.answer_char in text else super().parse_plain(text)


@pytest.fixture(scope="module")
def lpol(pol):
    """`pol`'s model under Latin1Tokenizer (generated ids re-encode to themselves) with room for 4-turn prompts."""
    return JaxPolicy(dataclasses.replace(pol.cfg, max_seq_len=512), pol.params, Latin1Tokenizer(), pool_tokens=320)


def _raw_episodes(policy, batch, n=6, **kw):
    return _episodes(policy, batch, n, agent=RawEcho(mode="plain", max_doc_chars=30), **kw)


def test_pool_sessions_equal_the_full_prefill_and_lockstep_at_temperature_zero(lpol):
    lock, _ = _raw_episodes(lpol, 2)
    assert len({len(e.steps) for e in lock}) > 1                         # episodes of different lengths
    pools = _pools(lpol)
    try:
        full, _ = _raw_episodes(lpol, 2, continuous=True)
        lpol.pool_sessions = True
        kept, _ = _raw_episodes(lpol, 2, continuous=True)
        over, _ = _raw_episodes(lpol, 2, continuous=True, overlap=True)   # release / submit during the next chunk
    finally:
        del lpol.continuous
        lpol.pool_sessions = False
    _same_episodes(lock, kept, atol=1e-4)
    _same_episodes(full, kept, atol=1e-4)
    _same_episodes(kept, over, atol=1e-4)
    a, b = pools[0].pool, pools[1].pool
    assert pools[2].pool.stats["reused"] == b.stats["reused"] and not pools[2].pool.parked
    turns = sum(len(e.steps) for e in lock)
    assert not a.sessions and b.sessions and a.stats["reused"] == 0
    # each episode's first turn is a full insert; every later turn whose ids extend the last prompt + completion
    # continues its parked row; one that does not (a completion ending at EOS: the text drops it) keeps their common
    # prefix (reused_partial) when it is at least 16 ids, else falls back
    # (2 slots, 6 episodes: finished episodes release their slots, so nothing is evicted)
    pairs = [(s.prompt_ids + s.token_ids, t.prompt_ids) for e in kept for s, t in zip(e.steps, e.steps[1:])]
    extend, common = sum(extends(h, x) for h, x in pairs), [shared_prefix(h, x) for h, x in pairs]
    assert b.stats["fallback_new"] == 6 and extend > 0 and b.stats["reused"] == sum(c > 0 for c in common)
    assert b.stats["reused_partial"] == b.stats["reused"] - extend and b.stats["reused_tokens"] == sum(common)
    assert b.stats["reused"] + b.stats["fallback_not_prefix"] == turns - 6
    assert b.stats["evicted"] == 0 and not b.parked and b.stats["inserts"] + b.stats["continued_inserts"] < turns
    assert b.stats["prefill_tokens"] < 0.75 * a.stats["prefill_tokens"]
    assert b.stats["appended_tokens"] + b.stats["reused_tokens"] == sum(len(s.prompt_ids) for e in kept
                                                                        for s in e.steps)
    assert lpol.pool_stats["reused"] == 2 * b.stats["reused"]                # the policy sums its pools' counters


def test_pool_sessions_at_temperature_one_sample_as_without(lpol):
    a, _ = _raw_episodes(lpol, 2, 4, continuous=True, temperature=1.0, seed=5)
    lpol.pool_sessions = True
    try:
        b, _ = _raw_episodes(lpol, 3, 4, continuous=True, temperature=1.0, seed=5)   # another batch size too
    finally:
        lpol.pool_sessions = False
    assert sum(len(e.steps) for e in b) > 4                                # later turns (continued rows) sampled
    _same_episodes(a, b, atol=1e-4)


def _turns(pool, prompts, turn):
    """prompts: {session: ids}; request id = session; fold (session, turn)."""
    for i, p in prompts.items():
        pool.submit(i, p, (i, turn), session=i)
    return _drain(pool)


def test_pool_sessions_fall_back_evict_and_release(lpol):
    """4 sessions in 3 slots (parked rows evicted for new ones, their next turn re-prefilled), stop strings ending
    rows at different lengths, a turn that rewrites its prompt's head (not a prefix extension: a full insert) and
    one that rewrites its tail (its common prefix with the parked row kept): the full prefill's tokens throughout."""
    cfg, params, tok = lpol.cfg, lpol._sample_params, lpol.tokenizer
    prompts = dict(enumerate(_prompts(4, seed=7)))
    sp = SamplingParams(max_new_tokens=12)
    probe = sample(cfg, params, list(prompts.values()), sp, jax.random.PRNGKey(0))
    rows = [set(probe.row(i)[0]) for i in range(len(prompts))]
    t = next(t for t in range(35, 130) if 1 <= sum(t in r for r in rows) <= len(rows) - 1)
    stop = [tok.decode([t])]
    pool = SlotPool(cfg, params, 3, 120, sp, jax.random.PRNGKey(0), stop_strings=stop, tokenizer=tok, chunk=8,
                    sessions=True)
    rng = np.random.default_rng(1)
    reasons = []
    for turn, keys in enumerate([(0, 1, 2), (0, 1, 3), (0, 1, 2, 3), (0, 2, 3)]):
        now = {i: prompts[i] for i in keys}
        got = _turns(pool, now, turn)
        ref = sample(cfg, params, list(now.values()), sp, jax.random.PRNGKey(0), stop_strings=stop, tokenizer=tok)
        for r, i in enumerate(keys):
            assert got[i].tokens == ref.row(r)[0] and got[i].finish_reason == ref.finish_reason[r]
            np.testing.assert_allclose(got[i].logprobs, ref.row(r)[1], rtol=0, atol=1e-4)
            reasons.append(got[i].finish_reason)
            tail = rng.integers(3, 250, size=2 + 2 * i).tolist()
            prompts[i] = (now[i][:1] + [3] + now[i][2:] + tail if (turn, i) == (1, 1)      # a new head: nothing kept
                          else now[i][:-1] + [3] + tail if (turn, i) == (1, 0)             # a new tail: its head kept
                          else now[i] + got[i].tokens + tail)
    st = pool.stats
    assert "stop" in reasons and "length" in reasons
    # turn 1: 3 evicts 2 (no request queued); turn 2: 2 back (evicted), turn 3: 0 and 3 evicted for 2's, 1's turns
    assert st["fallback_new"] == 4 and st["fallback_not_prefix"] == 1 and st["evicted"] >= 2
    assert st["reused_partial"] == 1
    assert st["fallback_evicted"] >= 1 and st["reused"] >= 5
    assert st["reused"] + st["fallback_new"] + st["fallback_not_prefix"] + st["fallback_evicted"] == 13
    pool.release(range(4))
    assert not pool.parked and all(k is None for k in pool.park)


def test_a_session_released_in_flight_does_not_park(lpol):
    """release() of a session whose request is queued or decoding: the request still finishes, its slot is then
    free (not parked until evicted); a key submitted again after its release parks as usual."""
    cfg, params = lpol.cfg, lpol._sample_params
    pool = SlotPool(cfg, params, 2, 64, SamplingParams(max_new_tokens=4), jax.random.PRNGKey(0), sessions=True)
    a, b = _prompts(2, seed=9)
    pool.submit("a", a, (0, 0), session="A")
    pool.release(["A"])               # queued
    pool.submit("b", b, (1, 0), session="B")
    pool.launch()
    pool.release(["B"])               # decoding
    pool.submit("b2", b, (2, 0), session="B")   # B is live again: its new request parks
    done = [f.rid for f in pool.collect()]
    while pool.busy:
        done += [f.rid for f in pool.step()]
    assert sorted(done) == ["a", "b", "b2"]
    assert list(pool.parked) == ["B"] and sum(k is not None for k in pool.park) == 1 and not pool.released


def test_parked_rows_survive_left_shifts_until_they_span_the_pool(lpol):
    """Other requests decode while a session is parked: the shared index moves on, the cache is shifted left without
    rolling the parked row out, and once the row would span more than the pool's tokens it is evicted."""
    cfg, params = lpol.cfg, lpol._sample_params
    sp = SamplingParams(max_new_tokens=12)
    a, others = [1] + list(range(50, 60)), iter(enumerate(_prompts(40, seed=5)))
    pool = SlotPool(cfg, params, 2, 64, sp, jax.random.PRNGKey(0), chunk=8, sessions=True)

    def turn(ids, t):   # session 0's turn t, checked against the full prefill
        got = _turns(pool, {0: ids}, t)[0]
        assert got.tokens == sample(cfg, params, [ids], sp, jax.random.PRNGKey(0)).row(0)[0]
        return ids + got.tokens + [40 + t, 41]

    def until(done):    # other requests (no session) through the free slot until `done()`
        while not done():
            b, p = next(others)
            pool.submit(("other", b), p, (b, 9))
            _drain(pool)

    nxt = turn(a, 0)
    until(lambda: pool.stats["shifts_left"])
    assert 0 in pool.parked
    nxt = turn(nxt, 1)
    assert pool.stats["reused"] == 1
    until(lambda: 0 not in pool.parked)
    assert pool.stats["evicted_span"] == 1
    turn(nxt, 2)
    assert pool.stats["fallback_evicted"] == 1 and pool.stats["fallback_new"] == 1


@pytest.mark.parametrize("group", [1, 2])
def test_pool_session_continues_after_a_stop_string_cut(lpol, group):
    """A row cut by a host stop string decoded past the cut: its next turn continues the kept ids only (group 2: a
    pool of shared prefixes, each session's one request in a group of its own, its completion stashed)."""
    cfg, params, tok = lpol.cfg, lpol._sample_params, lpol.tokenizer
    prompts = _prompts(3, seed=11)
    sp = SamplingParams(max_new_tokens=16)
    probe = sample(cfg, params, prompts, sp, jax.random.PRNGKey(0))
    # a stop string two tokens long ends inside a row: the device decodes on until the host's check after the chunk
    i, n = next((i, n) for i in range(3) for n in range(2, 12) if probe.row(i)[0][n] >= 35)
    stop = [tok.decode(probe.row(i)[0][n - 1:n + 1])]
    pool = SlotPool(cfg, params, 3 * group, 120, sp, jax.random.PRNGKey(0), stop_strings=stop, tokenizer=tok,
                    chunk=16, sessions=True, group=group)
    got = _turns(pool, dict(enumerate(prompts)), 0)
    assert got[i].finish_reason == "stop" and len(got[i].tokens) < 16
    if group == 1:   # a parked row's valid slots: its held ids, the cut ones dropped
        held = np.asarray(pool.cache["valid"]).sum(1)
    else:            # its group's prefix row (the prompt) + its stashed completion, the cut ones dropped
        held = (np.asarray(pool.store["valid"]).sum(1)
                + np.repeat(np.asarray(pool.cache["prefix"]["valid"]).sum(1), group))
    assert [int(held[pool.parked[j]].sum()) for j in range(3)] == [len(prompts[j]) + len(got[j].tokens)
                                                                   for j in range(3)]
    nxt = [p + got[j].tokens + [40, 41, 42] for j, p in enumerate(prompts)]
    got = _turns(pool, dict(enumerate(nxt)), 1)
    ref = sample(cfg, params, nxt, sp, jax.random.PRNGKey(0), stop_strings=stop, tokenizer=tok)
    assert pool.stats["reused"] == 3
    for j in range(3):
        assert got[j].tokens == ref.row(j)[0]
        np.testing.assert_allclose(got[j].logprobs, ref.row(j)[1], rtol=0, atol=1e-4)


def test_pool_sessions_need_an_opt_in(pol):
    pool = SlotPool(pol.cfg, pol._sample_params, 2, 64, SamplingParams(max_new_tokens=8), jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="sessions=True"):
        pool.submit("r", [1, 5, 6], (0, 0), session="e")


@pytest.mark.parametrize("group", [1, 3])
def test_pool_sessions_with_candidates_continue_the_picked_branch(lpol, group):
    """2 sessions x 3 candidates a turn at T = 1 (the candidates differ), each later turn extending a different
    candidate (j = turn % 3): the turn continues that branch, its prefill computed once and forked to the 3 slots
    (group 3: written once into the group's prefix row, which the 3 slots read), the other branches freed; samples
    are the ones of a pool without sessions (same folds), to float rounding, and so are the counters."""
    cfg, params = lpol.cfg, lpol._sample_params
    sp = SamplingParams(temperature=1.0, max_new_tokens=10)

    def run(sessions):
        pool = SlotPool(cfg, params, 6, 200, sp, jax.random.PRNGKey(3), chunk=8, sessions=sessions,
                        group=group if sessions else 1)
        prompts, out = dict(enumerate(_prompts(2, seed=4))), []
        for turn in range(4):
            for i, p in prompts.items():
                for j in range(3):
                    pool.submit((i, j), p, (3 * i + j, turn), **({"session": i} if sessions else {}))
            got = _drain(pool)
            out.append(got)
            assert all(len({tuple(got[i, j].tokens) for j in range(3)}) > 1 for i in prompts)   # branches differ
            if sessions and turn < 3:
                assert sorted(pool.parked) == [0, 1] and all(len(bs) == 3 for bs in pool.parked.values())
            pick = turn % 3
            prompts = {i: p + got[i, pick].tokens + [40 + turn, 41] for i, p in prompts.items()}
        return pool, out

    full, ref = run(False)
    kept, got = run(True)
    for a, b in zip(ref, got):
        for rid in a:
            assert a[rid].tokens == b[rid].tokens and a[rid].prompt_ids == b[rid].prompt_ids
            np.testing.assert_allclose(a[rid].logprobs, b[rid].logprobs, rtol=0, atol=1e-4)
    st = kept.stats
    # turn 0: one full prefill per session (shared by its 3 candidates); turns 1-3: every request continues its
    # session's picked branch, the appended ids prefilled once per session
    assert st["fallback_new"] == 6 and st["reused"] == 18 and st["prefill_shared"] == 2 * 2 + 3 * 2 * 2
    appended = sum(len(got[t][i, 0].prompt_ids) - len(got[t - 1][i, (t - 1) % 3].prompt_ids)
                   - len(got[t - 1][i, (t - 1) % 3].tokens) for t in range(1, 4) for i in range(2))
    assert st["appended_tokens"] == sum(len(got[0][i, 0].prompt_ids) for i in range(2)) + appended
    assert st["prefill_tokens"] < 0.5 * full.stats["prefill_tokens"]
    if group > 1:   # the turns' rows read their history from 2 prefix rows; the own slots shifted on meanwhile
        assert st["shifts_left"] >= 1 and kept.nbytes < 0.5 * full.nbytes
    kept.release([0, 1])
    assert not kept.parked and all(k is None for k in kept.park)


def test_pool_sessions_with_candidates_in_the_rollout_engine(lpol):
    """n_candidates = 3 with the pool's KV sessions: the episodes of the pool without sessions (T = 1, same folds),
    and the turns that extend the picked candidate continue its parked row."""
    def largest(states, cands):
        return [max(range(len(cs)), key=lambda j: (list(cs[j].completion.token_ids), j)) for cs in cands]

    kw = dict(continuous=True, temperature=1.0, seed=5, n_candidates=3, select=largest)
    a, _ = _raw_episodes(lpol, 2, 4, **kw)
    pools = _pools(lpol)
    lpol.pool_sessions = True
    try:
        b, _ = _raw_episodes(lpol, 2, 4, **kw)
    finally:
        del lpol.continuous
        lpol.pool_sessions = False
    _same_episodes(a, b, atol=1e-4)
    st = pools[0].pool.stats
    assert pools[0].pool.group == 3 and pools[0].pool.sessions   # a turn's candidates: a group reading its history
    turns = [(s, t) for e in b for s, t in zip(e.steps, e.steps[1:])]
    extend = sum(extends(s.prompt_ids + s.token_ids, t.prompt_ids) for s, t in turns)
    # a turn keeps the branch (the executed candidate or another) sharing most of its ids: all of them when it
    # extends it, else their common prefix when it is long enough (shared_prefix)
    kept = sum(max(shared_prefix(s.prompt_ids + ids, t.prompt_ids)
                   for ids in [s.token_ids] + [c["token_ids"] for c in s.candidates]) > 0 for s, t in turns)
    assert extend > 0 and st["reused"] == 3 * kept and st["fallback_new"] == 3 * 4
    assert st["reused"] + st["fallback_not_prefix"] == 3 * len(turns)
    assert not pools[0].pool.parked


def test_grouped_sessions_share_a_group_fall_back_and_evict(lpol):
    """A pool of 2 groups of 2 slots with sessions. Turn 0: sessions A and B send the same prompt, one request each:
    they share group 0's prefix row. Turn 1: A continues into the free group 1 (group 0 still holds B's branch),
    B's own group then holds nothing, but A reads it in this insert, so B is a full insert (a continuation's target
    is never a group another continuation reads). Then C, new, finds both groups parked: the oldest parked session
    is evicted for it, and that session's next turn is a full insert. Every turn gives the full prefill's tokens."""
    cfg, params = lpol.cfg, lpol._sample_params
    sp = SamplingParams(max_new_tokens=8)
    pool = SlotPool(cfg, params, 4, 120, sp, jax.random.PRNGKey(0), chunk=4, sessions=True, group=2)
    p, c = _prompts(2, seed=13)

    def turn(prompts, t):
        got = _turns(pool, prompts, t)
        ref = sample(cfg, params, list(prompts.values()), sp, jax.random.PRNGKey(0))
        for r, k in enumerate(prompts):
            assert got[k].tokens == ref.row(r)[0]
            np.testing.assert_allclose(got[k].logprobs, ref.row(r)[1], rtol=0, atol=1e-4)
        return {k: prompts[k] + got[k].tokens + [40 + t, 41] for k in prompts}

    A, B, C = 0, 1, 2
    nxt = turn({A: p, B: p}, 0)
    assert pool.stats["prefill_shared"] == 1 and pool.park == [A, B, None, None]
    nxt = turn(nxt, 1)
    st = pool.stats
    assert st["reused"] == 1 and st["fallback_not_prefix"] == 1 and st["fallback_new"] == 2
    assert pool.parked[A] == [2] and pool.parked[B] == [0]     # A continued into group 1, B re-prefilled in 0
    turn({C: c}, 0)                                   # no free group: the oldest parked session gives up its rows
    assert st["evicted_slot"] == 1 and len(pool.parked) == 2 and C in pool.parked
    gone = next(k for k in (A, B) if k not in pool.parked)
    turn({gone: nxt[gone]}, 2)
    assert st["fallback_evicted"] == 1 and st["evicted_slot"] == 2
    # a group some of whose rows still decode (a turn's candidates finish apart) frees nothing: the session parked
    # in it is kept, however old, and the one whose group eviction does free goes
    old, young = list(pool.parked)
    g_old = pool.parked[old][0] // 2
    pool.owner[2 * g_old + 1 - pool.parked[old][0] % 2] = "decoding"   # its sibling slot: a stand-in in-flight row
    assert pool._free_group([], set()) == 1 - g_old and list(pool.parked) == [old]


def test_grouped_session_sending_two_prompts_in_one_insert_serves_both(lpol):
    """One session's two different prompts queued together: the first continues its parked branch, the second is a
    full insert in a group of its own; both give the full prefill's tokens."""
    cfg, params = lpol.cfg, lpol._sample_params
    sp = SamplingParams(max_new_tokens=8)
    pool = SlotPool(cfg, params, 4, 120, sp, jax.random.PRNGKey(0), chunk=4, sessions=True, group=2)
    p = _prompts(1, seed=17)[0]
    first = _turns(pool, {0: p}, 0)[0]
    a = p + first.tokens + [40, 41]
    pool.submit("a", a, (0, 1), session=0)
    pool.submit("b", a + [42], (0, 2), session=0)
    got = _drain(pool)
    ref = sample(cfg, params, [a, a + [42]], sp, jax.random.PRNGKey(0))
    assert [got["a"].tokens, got["b"].tokens] == [ref.row(0)[0], ref.row(1)[0]]
    assert pool.stats["reused"] == 1 and pool.stats["fallback_new"] == 2


def test_grouped_sessions_random_workload_gives_the_full_prefill_tokens(lpol):
    """Random rounds over a pool of 2 groups of 3: 4 sessions sending 1-3 candidates a turn (fewer slots than
    work: evictions, waits), prompts that extend the last turn, rewrite its tail or start over, releases, requests
    with no session. Every request finishes once, with the full prefill's greedy tokens; every session request is
    counted once as reused or as a fallback."""
    cfg, params = lpol.cfg, lpol._sample_params
    sp = SamplingParams(max_new_tokens=6)
    pool = SlotPool(cfg, params, 6, 120, sp, jax.random.PRNGKey(0), chunk=4, sessions=True, group=3)
    rng = np.random.default_rng(23)
    prompts = dict(enumerate(_prompts(4, seed=19)))
    session_requests = 0
    for rnd in range(8):
        now = {k: prompts[k] for k in rng.permutation(4)[:rng.integers(1, 5)].tolist()}
        counts = {k: int(rng.integers(1, 4)) for k in now}
        loose = _prompts(int(rng.integers(0, 3)), seed=100 + rnd)
        for k, ids in now.items():
            for j in range(counts[k]):
                pool.submit((k, j), ids, (k, 10 * rnd + j), session=k)
        for j, ids in enumerate(loose):
            pool.submit(("loose", j), ids, (9, 10 * rnd + j))
        session_requests += sum(counts.values())
        got = _drain(pool)
        assert len(got) == sum(counts.values()) + len(loose)
        order = list(now.values()) + loose
        ref = sample(cfg, params, order, sp, jax.random.PRNGKey(0))
        for r, k in enumerate(now):
            for j in range(counts[k]):
                assert got[k, j].tokens == ref.row(r)[0], (rnd, k, j)
        for j in range(len(loose)):
            assert got["loose", j].tokens == ref.row(len(now) + j)[0]
        for k, ids in now.items():
            tail = rng.integers(3, 250, size=int(rng.integers(1, 6))).tolist()
            kind = rng.integers(0, 4)
            prompts[k] = (ids + got[k, 0].tokens + tail if kind < 2 else ids[:-2] + tail if kind == 2
                          else _prompts(1, seed=200 + 10 * rnd + k)[0])
        if rng.random() < 0.3:
            pool.release([int(rng.integers(0, 4))])
    st = pool.stats
    assert st["reused"] > 0 and st["evicted"] > 0
    assert st["reused"] + sum(v for key, v in st.items() if key.startswith("fallback_")) == session_requests


# ---- prefix cache: released rows stay, new sessions fork from them ------------------------------------------
def test_prefix_cache_forks_new_sessions_from_a_released_row(lpol):
    """prefix_cache: a released session's row stays as a cached row; new sessions whose prompts share its head fork
    from it into free slots (the cached row is left as it was, so it serves again), requests with identical ids
    fork once, and the tokens are the full prefill's. A request needing a slot evicts the cached row, not a parked
    session."""
    cfg, params = lpol.cfg, lpol._sample_params
    sp = SamplingParams(max_new_tokens=6)
    rng = np.random.default_rng(5)
    base = [1] + rng.integers(3, 250, size=40).tolist()
    pool = SlotPool(cfg, params, 4, 160, sp, jax.random.PRNGKey(0), sessions=True, prefix_cache=True)
    with pytest.raises(ValueError, match="sessions=True"):
        SlotPool(cfg, params, 4, 160, sp, jax.random.PRNGKey(0), prefix_cache=True)
    pool.submit("a", base, (0, 0), session="A")
    held = base + _drain(pool)["a"].tokens
    pool.release(["A"])
    (src,) = pool._cached_slots()
    assert not pool.parked.get("A") and pool.held[src] == held
    x, y = base + rng.integers(3, 250, size=10).tolist(), base[:30] + rng.integers(3, 250, size=9).tolist()
    kx, ky = shared_prefix(held, x), shared_prefix(held, y)
    assert kx >= 40 and ky == 30
    for rid, ids in (("x1", x), ("x2", x), ("y", y)):
        pool.submit(rid, ids, (0, len(rid)), session=rid.upper())
    got = _drain(pool)
    ref = sample(cfg, params, [x, x, y], sp, jax.random.PRNGKey(0))
    for r, rid in enumerate(("x1", "x2", "y")):
        assert got[rid].tokens == ref.row(r)[0]
        np.testing.assert_allclose(got[rid].logprobs, ref.row(r)[1], rtol=0, atol=1e-4)
    st = pool.stats
    assert st["reused_cached"] == st["reused"] == 3 and st["reused_tokens"] == 2 * kx + ky
    assert st["prefill_shared"] == 1 and st["appended_tokens"] == len(base) + len(x) - kx + len(y) - ky
    assert st["fallback_new"] == 1 and pool._cached_slots() == [src] and pool.held[src] == held   # left as it was
    pool.release(["X1", "X2", "Y"])                     # four cached rows: the pool is full of them
    assert len(pool._cached_slots()) == 4
    w = x[:kx] + rng.integers(3, 250, size=5).tolist()  # forks again (from the row that keeps the most), in the
    pool.submit("w", w, (1, 0), session="W")            # slot of an evicted cached row, the source kept
    got = _drain(pool)
    assert got["w"].tokens == sample(cfg, params, [w], sp, jax.random.PRNGKey(0)).row(0)[0]
    assert st["reused_cached"] == 4 and st["dropped_cached"] == 1 and len(pool._cached_slots()) == 3
    pool.submit("z", _prompts(1, seed=11)[0], (9, 9), session="Z")   # unrelated: a full insert that evicts a
    _drain(pool)                                                     # cached row, not W's parked one
    assert st["fallback_new"] == 2 and st["dropped_cached"] == 2 and len(pool._cached_slots()) == 2
    assert st["evicted"] == 0 and not pool.evicted   # no session lost its row
    assert pool.parked.get("W") and pool.parked.get("Z")


def test_prefix_cache_prefills_a_head_shared_within_one_insert_once(lpol):
    """prefix_cache: distinct new prompts of one insert whose common prefix keeps at least min_shared ids and a
    quarter of each have it prefilled once, each prompt's rest against it: the tokens of the full prefill, fewer
    prompt tokens computed. A prompt sharing too little of its length (the quarter rule) is prefilled in full."""
    cfg, params = lpol.cfg, lpol._sample_params
    sp = SamplingParams(max_new_tokens=6)
    rng = np.random.default_rng(7)
    head = [1] + rng.integers(3, 250, size=40).tolist()
    a, b = head + rng.integers(3, 250, size=9).tolist(), head[:35] + rng.integers(3, 250, size=12).tolist()
    d = head[:20] + rng.integers(3, 250, size=61).tolist()     # 20 of 81 ids shared: under a quarter
    prompts = {"a1": a, "a2": a, "b": b, "c": _prompts(1, seed=11)[0], "d": d}
    ref = sample(cfg, params, list(prompts.values()), sp, jax.random.PRNGKey(0))
    stats = {}
    for cache in (False, True):
        pool = SlotPool(cfg, params, 5, 160, sp, jax.random.PRNGKey(0), sessions=True, prefix_cache=cache)
        for i, (rid, ids) in enumerate(prompts.items()):
            pool.submit(rid, ids, (0, i), session=rid.upper())
        got = _drain(pool)
        for r, rid in enumerate(prompts):
            assert got[rid].tokens == ref.row(r)[0], (cache, rid)
            np.testing.assert_allclose(got[rid].logprobs, ref.row(r)[1], rtol=0, atol=1e-4)
        stats[cache] = pool.stats
    off, on = stats[False], stats[True]
    assert off["prefix_shared"] == 0 and on["prefix_shared"] == 2 and on["prefix_shared_tokens"] == 35
    assert on["prefill_shared"] == off["prefill_shared"] == 1                  # a2 copies a's row either way
    assert on["fallback_new"] == off["fallback_new"] == 5 and on["reused"] == 0
    total = len(a) + len(b) + len(prompts["c"]) + len(d)
    assert off["appended_tokens"] == total and on["appended_tokens"] == total - 35
    assert on["prefill_tokens"] < off["prefill_tokens"]
    assert pool._prefix_groups([tuple(a), tuple(b), tuple(d)])[0] == [(35, sorted([tuple(a), tuple(b)]))]
    pool.min_shared = 0                                                           # 0: extensions only, no groups
    assert pool._prefix_groups([tuple(a), tuple(b)]) == ([], [tuple(a), tuple(b)])


def test_prefix_cache_outlives_the_rollout_call_and_serves_the_next(lpol):
    """JaxPolicy(prefix_cache=True): `continuous` keeps its slot pool between calls of the same settings and finished
    episodes' rows stay cached, so a later call that continues those episodes from an earlier step (as MCTS rollouts
    continue a node's trajectory, k copies each) forks from them: the same episodes as without the cache, fewer
    prompt tokens prefilled; new params drop the pool."""
    cfg = RolloutConfig(k=1, batch_size=4, max_steps=2, max_new_tokens=12, continuous=True)
    agent = EchoSearch(mode="plain", max_doc_chars=30)
    runs, stats = {}, {}
    for cache in (False, True):
        p = JaxPolicy(lpol.cfg, lpol.params, Latin1Tokenizer(), pool_tokens=320, pool_sessions=True,
                      prefix_cache=cache)
        first = rollout(p, HashRetriever(PASSAGES), agent, QUESTIONS[:2], cfg)
        pool = p._pool
        partial = [Episode(e.qid, e.question, list(e.gold), agent="echo", steps=copy.deepcopy(e.steps[:1]))
                   for e in first for _ in range(2)]
        before = collections.Counter(p.pool_stats)
        runs[cache] = first + rollout(p, HashRetriever(PASSAGES), agent, partial,
                                      dataclasses.replace(cfg, max_steps=3, seed=1))
        stats[cache] = p.pool_stats - before
        assert (pool is not None and p._pool is pool) == cache   # the same pool served both calls
    _same_episodes(runs[False], runs[True], atol=1e-4)
    assert stats[False]["reused_cached"] == 0 and stats[True]["reused_cached"] >= 2
    assert stats[True]["appended_tokens"] < stats[False]["appended_tokens"]
    assert stats[True]["prefill_tokens"] < stats[False]["prefill_tokens"]
    p.params = p.params
    assert p._pool is None


def test_mcts_rollouts_fork_from_the_rows_earlier_iterations_left(lpol):
    """ReasonRAG MCTS over a real policy with PolicyTreeEnv(continuous=True): with the prefix cache and
    pool_expansions, expansions also run through the kept pool and each iteration's rollouts fork from the rows that
    expansions and earlier rollouts left; at temperature 0 the trees (every node's action, ids, value and visits)
    are the ones grown without them."""
    from jaxrag.supervision.mcts import MCTSConfig, run_mcts, tree_to_json
    from jaxrag.supervision.mcts_env import PolicyTreeEnv

    def strip(x):   # wall-clock timings and float-rounded log-probs aside
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("timing", "logprobs")}
        return [strip(v) for v in x] if isinstance(x, list) else x

    trees, stats = {}, {}
    for cache in (False, True):
        p = JaxPolicy(lpol.cfg, lpol.params, Latin1Tokenizer(), pool_tokens=320, pool_sessions=True,
                      prefix_cache=cache)
        env = PolicyTreeEnv(p, HashRetriever(PASSAGES), RawEcho(mode="plain", max_doc_chars=30), k=1, batch_size=4,
                            max_new_tokens=12, temperature=0.0, rollout_temperature=0.0, continuous=True,
                            pool_expansions=cache)
        out = run_mcts(env, QUESTIONS[:2], MCTSConfig(max_iterations=3, rollouts_per_node=2, max_depth=4))
        trees[cache], stats[cache] = [strip(tree_to_json(t)) for t in out], collections.Counter(p.pool_stats)
    assert trees[True] == trees[False]
    assert sum(len(t["nodes"]) for t in trees[True]) > 4 and env.calls["rollout"] >= 2
    assert stats[False]["reused_cached"] == 0 and stats[True]["reused_cached"] > 0
    assert stats[True]["finished"] > stats[False]["finished"]   # the expansions' samples went through the pool too
    assert stats[True]["prefill_tokens"] < stats[False]["prefill_tokens"]   # and still fewer token slots prefilled


def test_candidates_through_the_pool_equal_the_batched_call(lpol):
    """rollout.candidates(slots=...) (pool_generate): the same prompts and, at temperature 0, the same candidates as
    the one batched generate call, with more requests than slots; with sessions, each state's n rows are released."""
    from jaxrag.env.mdp import State
    from jaxrag.env.rollout import candidates

    agent = RawEcho(mode="plain", max_doc_chars=30)
    states = [State(question=q["question"]) for q in QUESTIONS[:3]]
    p_a, a = candidates(lpol, agent, states, 2, max_new_tokens=12)
    pol = JaxPolicy(lpol.cfg, lpol.params, Latin1Tokenizer(), pool_tokens=320, pool_sessions=True, prefix_cache=True)
    p_b, b = candidates(pol, agent, states, 2, max_new_tokens=12, slots=4)
    assert p_a == p_b
    for xs, ys in zip(a, b):
        for x, y in zip(xs, ys):
            assert x.action == y.action and x.completion.token_ids == y.completion.token_ids
            np.testing.assert_allclose(x.completion.logprobs, y.completion.logprobs, rtol=0, atol=1e-4)
    pool = pol._pool   # every row left is a cached one (the states' sessions were released)
    assert pol.pool_stats["finished"] == 6 and sorted(pool._cached_slots()) == sorted(pool._parked_slots()) != []
