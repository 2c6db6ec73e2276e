"""Cross-turn KV reuse (sampling.sessions): the reuse path equals the full-prefill path over multi-turn episodes."""
import collections
import random

import jax
import numpy as np
import pytest

from fakes import EchoSearch, Latin1Tokenizer, OverlapRetriever, Passage, tiny_jax_policy
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import QUERY, Action, Doc, State, Step
from jaxrag.env.rollout import RolloutConfig, rollout
from jaxrag.models.transformer import init_cache, prefill
from jaxrag.sampling import bucket, left_pad
from jaxrag.sampling.sessions import PoolFull, SessionPool, extends, fine_bucket, shared_prefix


def policy(slots=0, tokens=None):
    pol = tiny_jax_policy(0, 512, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)
    pol.tokenizer = Latin1Tokenizer()
    if slots:
        pol.sessions = SessionPool(pol.cfg, slots, tokens or pol.cfg.max_seq_len)
    return pol


def same(a, b, first_turn=False, tol=1e-4):
    for xs, ys in zip(a, b):
        assert len(xs) == len(ys)
        for x, y in zip(xs, ys):   # every candidate of the prompt
            assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
            assert x.prompt_ids == y.prompt_ids
            if first_turn:   # the first turn is generate.sample's own prefill
                assert x.logprobs == y.logprobs
            else:            # later turns: attention over the cache sums in another order
                np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=tol, atol=tol)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_reuse_equals_full_prefill_over_turns(temperature):
    full, reuse = policy(), policy(slots=4)
    prompts = ["question: a\n", "question: something longer here\n", "q: mid\n"]
    keys = ["e0", "e1", "e2"]
    stop = None
    for turn in range(3):
        a = full.generate(prompts, temperature=temperature, max_new_tokens=12, seed=turn, stop=stop)
        b = reuse.generate(prompts, temperature=temperature, max_new_tokens=12, seed=turn, stop=stop, sessions=keys)
        same(a, b, first_turn=turn == 0)
        if turn == 0:  # a stop string inside later completions: tokens after the cut are dropped from its slot
            longest = max((o[0].text for o in a), key=len)
            stop = [longest[len(longest) // 2]]
        prompts = [p + o[0].text + f"doc: {'xy' * (3 * i + turn)}\n" for i, (p, o) in enumerate(zip(prompts, a))]
        if turn == 0:  # a new episode joins continuing ones: its own prefill pass, then one decode batch
            prompts, keys = prompts + ["question: a late one\n"], keys + ["e3"]
    st = reuse.sessions.stats
    assert st["reused"] + st["fallback_not_prefix"] == 7 and st["reused"] >= 5 and st["fallback_new"] == 4
    assert reuse.prefill_tokens < full.prefill_tokens
    assert reuse.decode_tokens == full.decode_tokens and 0 < full.decode_tokens <= full.decode_slots
    assert sorted(reuse.sessions.slot_of.values()) == [0, 1, 2, 3]
    assert [reuse.sessions.ids[k] for k in keys] == [o[0].prompt_ids + o[0].token_ids for o in b]


PASSAGES = [Passage(f"p{i}", f"T{i}", f"fact number {i} about topic{i % 3}" + " more" * i) for i in range(12)]
EXAMPLES = [{"id": f"q{i}", "question": f"question {i} " + "long " * (2 * i), "golden_answers": ["x"]} for i in range(5)]


def test_rollout_engine_keeps_sessions_and_matches_the_plain_path():
    cfg = RolloutConfig(k=2, batch_size=3, max_steps=3, max_new_tokens=10, temperature=1.0)
    agent = EchoSearch(mode="plain", max_doc_chars=40)
    plain = rollout(policy(), OverlapRetriever(PASSAGES), agent, EXAMPLES, cfg)
    pol = policy(slots=3)
    kept = rollout(pol, OverlapRetriever(PASSAGES), agent, EXAMPLES, cfg)
    for e, f in zip(plain, kept):
        assert len(e.steps) == len(f.steps) == 3
        for s, t in zip(e.steps, f.steps):
            assert s.token_ids == t.token_ids and s.prompt_ids == t.prompt_ids
            np.testing.assert_allclose(s.logprobs, t.logprobs, rtol=1e-4, atol=1e-4)
    st = pol.sessions.stats
    assert st["fallback_new"] == 5 and st["reused"] >= 8          # 5 episodes x 3 turns: 10 continuations
    assert not pol.sessions.slot_of                                # every finished episode released its slot


@pytest.mark.parametrize("min_shared", [16, 0])
def test_a_design_that_is_not_append_only_keeps_its_common_prefix(min_shared):
    """Chat ReAct (RAG-Gym's format) puts the question after the growing history: the next prompt never extends the
    last one, but it shares its head (system message, history so far: here over a quarter of it). With min_shared > 0
    the session keeps that common prefix and prefills the rest; with 0 the turn is a full prefill (the plain path
    exactly)."""
    agent = get_agent("react", mode="chat", tokenizer=Latin1Tokenizer())

    def pol(slots=0):
        p = tiny_jax_policy(0, 2048, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)
        p.tokenizer = Latin1Tokenizer()
        if slots:
            p.sessions = SessionPool(p.cfg, slots, p.cfg.max_seq_len, min_shared=min_shared)
        return p

    full, reuse = pol(), pol(slots=2)
    done = Step(Action(QUERY, "q0", "raw"), docs=[Doc("d0", 0, "T", "a long document " * 40)])   # a turn before
    states = [State(question="who?", history=[done]), State(question="where is it?", history=[done])]
    a = full.generate([agent.render(s) for s in states], max_new_tokens=8)
    b = reuse.generate([agent.render(s) for s in states], max_new_tokens=8, sessions=["a", "b"])
    same(a, b, first_turn=True)
    nxt = [State(question=s.question, history=[done, Step(Action(QUERY, "q", o[0].text), docs=[Doc("d", 0, "T", "x")])])
           for s, o in zip(states, a)]
    prompts = [full.encode_prompt(agent.render(s), 8) for s in nxt]
    held = [o[0].prompt_ids + o[0].token_ids for o in b]
    first = sum(len(o[0].prompt_ids) for o in b)   # the first turn's appended ids: whole prompts
    assert not any(extends(h, p) for h, p in zip(held, prompts))
    common = [next(i for i, (x, y) in enumerate(zip(h, p)) if x != y) for h, p in zip(held, prompts)]
    assert min(4 * c - len(p) for c, p in zip(common, prompts)) >= 0   # the system message and the history so far
    before = reuse.prefill_tokens
    a = full.generate([agent.render(s) for s in nxt], max_new_tokens=8)
    b = reuse.generate([agent.render(s) for s in nxt], max_new_tokens=8, sessions=["a", "b"])
    st = reuse.sessions.stats
    if min_shared:
        same(a, b)
        assert st["reused"] == st["reused_partial"] == 2 and st["fallback_not_prefix"] == 0
        assert st["reused_tokens"] == sum(common)
        assert st["appended_tokens"] == first + sum(len(p) - c for p, c in zip(prompts, common))
        assert reuse.prefill_tokens - before == 2 * fine_bucket(max(len(p) - c for p, c in zip(prompts, common)))
    else:
        same(a, b, first_turn=True)   # both turns are full prefills: the plain path exactly
        assert st["fallback_not_prefix"] == 2 and st["reused"] == st["reused_partial"] == 0


def assert_slots_hold_their_ids(pol):
    """Every branch's pool slot holds the keys/values of its held ids (those of a fresh prefill, to rounding)."""
    for branches in pol.sessions.branches.values():
        for slot, ids in branches:
            tokens, positions, valid = (jax.numpy.asarray(a) for a in left_pad([ids], 1, len(ids)))
            _, want = prefill(pol.cfg, pol.params, tokens, positions, valid, init_cache(pol.cfg, 1, len(ids)))
            for got, ref in zip(pol.sessions.kv["k"] + pol.sessions.kv["v"], want["k"] + want["v"]):
                np.testing.assert_allclose(np.asarray(got[slot, :, :len(ids)]), np.asarray(ref[0]), atol=1e-4)


@pytest.mark.parametrize("n,cascade", [(1, False), (2, False), (2, True)])
def test_a_new_session_beside_a_long_append_is_stored_where_it_belongs(n, cascade):
    """One call continuing a session by many appended ids (T = 96 slots) beside a new session whose prompt is short
    (6 ids, against M = 32 kept slots): the new rows' completions land right after their prompts in their slots.
    Before the fix the store's window start (M + kept - T < 0) was clamped to 0, the completion written 58 slots
    past its place (the rollout bench at batch 8 sampled other tokens than the full prefill from then on)."""
    full, reuse = policy(), policy(slots=2 * n)
    full.cascade = reuse.cascade = cascade
    a = full.generate(["question: a\n"], n=n, max_new_tokens=8, seed=0)
    b = reuse.generate(["question: a\n"], n=n, max_new_tokens=8, seed=0, sessions=["a"])
    same(a, b, first_turn=True)
    prompts = ["question: a\n" + a[0][0].text + "doc: " + "xy" * 40 + "\n", "q: b\n"]
    for turn in (1, 2):
        a = full.generate(prompts, n=n, max_new_tokens=8, seed=turn)
        b = reuse.generate(prompts, n=n, max_new_tokens=8, seed=turn, sessions=["a", "b"])
        same(a, b)
        assert_slots_hold_their_ids(reuse)
        prompts = [p + o[0].text + "doc: z\n" for p, o in zip(prompts, a)]
    assert reuse.sessions.stats["reused"] == 3 and reuse.sessions.stats["fallback_new"] == 2


def test_pool_limits_are_clear_errors_and_new_params_forget_sessions():
    pol = policy(slots=2, tokens=40)
    with pytest.raises(PoolFull, match="does not fit a pool of 2 slots"):
        pol.generate(["a", "b", "c"], max_new_tokens=4, sessions=[1, 2, 3])
    with pytest.raises(PoolFull, match="tokens per slot"):
        pol.generate(["x" * 30], max_new_tokens=16, sessions=[1])
    with pytest.raises(ValueError, match="session_slots > 0"):
        policy().generate(["a"], sessions=[1])
    with pytest.raises(PoolFull, match=r"1 sessions x 3 candidates does not fit a pool of 2 slots.*batch x n_cand"):
        pol.generate(["a"], n=3, max_new_tokens=4, sessions=[1])   # a session needs a slot per candidate
    pol.generate(["a", "b"], max_new_tokens=4, sessions=[1, 2])
    pol.generate(["c"], max_new_tokens=4, sessions=[3])            # a full pool evicts the least recently used
    assert set(pol.sessions.slot_of) == {2, 3} and pol.sessions.stats["evicted"] == 1
    pol.params = jax.tree.map(lambda x: x, pol.params)
    assert not pol.sessions.slot_of and not pol.sessions.ids
    assert pol.sessions.nbytes == 2 * 2 * 2 * 40 * 16 * 4          # k+v x layers x slots x tokens x (K*Dh) x fp32


# ---- n > 1: a session keeps a branch per candidate ------------------------------------------------------------
@pytest.mark.parametrize("temperature,cascade", [(0.0, True), (1.0, True), (1.0, False)])
def test_n_candidates_continue_the_picked_branch_as_the_share_prefix_path(temperature, cascade):
    """Each turn's prompt extends candidate j = turn % n: the same tokens as generate.sample(n=n), log-probs to
    1e-4 (rounding), and each prompt's appended tokens are prefilled once, not n times; the n rows read their
    prompt's cache once (cascade) or copy it, and each branch's slot stores its prompt and completion either way."""
    n = 3
    full, reuse = policy(), policy(slots=4 * n)
    full.cascade = reuse.cascade = cascade
    st = reuse.sessions.stats
    prompts = ["question: a\n", "question: something longer here\n", "q: mid\n"]
    keys, held = ["e0", "e1", "e2"], [[], [], []]   # held: the ids of each prompt's branches (its candidates)
    stop, cut = None, 0
    for turn in range(4):
        ids = [reuse.tokenizer.encode(p, add_bos=True) for p in prompts]
        kept = [max((shared_prefix(h, x) for h in hs), default=0) for hs, x in zip(held, ids)]   # the best branch
        new = [len(x) for x, k in zip(ids, kept) if not k]
        pre, count = reuse.prefill_tokens, collections.Counter(st)
        a = full.generate(prompts, n=n, temperature=temperature, max_new_tokens=10, seed=turn, stop=stop)
        b = reuse.generate(prompts, n=n, temperature=temperature, max_new_tokens=10, seed=turn, stop=stop,
                           sessions=keys)
        same(a, b, first_turn=turn == 0, tol=1e-4)
        cut += sum(c.finish_reason == "stop" for o in b for c in o)
        distinct = [len({tuple(c.prompt_ids + c.token_ids) for c in o}) for o in b]
        assert [len({tuple(h) for _, h in reuse.sessions.branches[k]}) for k in keys] == distinct
        assert max(distinct) == 1 if temperature == 0 else max(distinct) > 1   # greedy: n equal candidates
        if any(kept):   # one row of appended tokens per prompt (a new prompt: its own pass), none per candidate
            appended = [len(x) - k for x, k in zip(ids, kept) if k]
            assert reuse.prefill_tokens - pre == bucket(len(prompts), 1) * fine_bucket(max(appended)) + (
                bucket(len(new), 1) * fine_bucket(max(new)) if new else 0)
            assert st["reused"] - count["reused"] == len(appended)
            assert st["appended_tokens"] - count["appended_tokens"] == sum(appended) + sum(new)
        if turn == 0:  # a stop string inside a later completion: the tokens after its cut leave that branch's slot
            stop = [a[0][1].text[4]]
        j = turn % n
        held = [[c.prompt_ids + c.token_ids for c in o] for o in b]
        prompts = [p + o[j].text + f"doc: {'xy' * (2 * i + turn)}\n" for i, (p, o) in enumerate(zip(prompts, a))]
        if turn == 0:  # a new episode joins continuing ones: its own prefill pass, then one forked decode batch
            prompts, keys, held = prompts + ["question: a late one\n"], keys + ["e3"], held + [[]]
    assert st["reused"] + st["fallback_not_prefix"] == 3 + 4 + 4 and st["fallback_new"] == 4 and cut > 0
    assert reuse.prefill_tokens < full.prefill_tokens
    assert sorted(s for k in keys for s, _ in reuse.sessions.branches[k]) == list(range(4 * n))
    assert [[h for _, h in reuse.sessions.branches[k]] for k in keys] == [
        [c.prompt_ids + c.token_ids for c in o] for o in b]


def test_a_call_stores_the_branches_a_session_can_continue_and_only_those():
    """A call's store waits for the next call: of a session's n candidates only the branch the next call continues
    is stored (its other slots take that call's candidates), while a session the call leaves out keeps every
    branch; stored slots hold their ids' keys/values, and a later turn continuing a branch stored late equals the
    full prefill."""
    n, pol, full = 2, policy(slots=4), policy()
    st, sess = pol.sessions.stats, pol.sessions
    qs = ["question: which one is it?\n", "question: and this other one?\n"]
    kw = dict(n=n, temperature=1.0, max_new_tokens=6)
    a = full.generate(qs, seed=0, **kw)
    same(a, pol.generate(qs, seed=0, sessions=["a", "b"], **kw), first_turn=True)
    assert st["stored_rows"] == 0 and sess.pending is not None   # four rows decoded, none stored yet
    p = [qs[0] + a[0][1].text + "obs: x\n"]
    same(full.generate(p, seed=1, **kw), pol.generate(p, seed=1, sessions=["a"], **kw))
    assert st["stored_rows"] == 1 + n   # a's continued branch, b's two; not a's other candidate
    assert_slots_hold_their_ids(pol)    # reading the pool stores the call's rows: a's two new branches
    assert st["stored_rows"] == 1 + n + n and sess.pending is None
    p = [qs[1] + a[1][1].text + "obs: y\n"]   # b continues a branch stored one call late
    same(full.generate(p, seed=2, **kw), pol.generate(p, seed=2, sessions=["b"], **kw))
    assert st["reused"] == 2 and st["fallback_new"] == 2
    pol.release(["a"])
    assert sess.pending is not None   # b's rows still wait
    pol.release(["b"])
    assert sess.pending is None and st["stored_rows"] == 1 + n + n   # released sessions' rows: dropped, not stored


def test_a_prompt_continues_the_branch_it_extends_else_falls_back():
    n, pol, full = 3, policy(slots=3), policy()
    sess = pol.sessions
    q = ["question: which branch?\n"]
    # a seed whose three samples differ and re-encode (a random model may sample the pad, BOS or EOS id, which no
    # text holds): samples do not depend on sessions, so the sessionless policy finds it
    seed = next(s for s in range(50) if (lambda cs: len({tuple(c.token_ids) for c in cs}) == n and all(
        full.tokenizer.encode(c.text) == c.token_ids for c in cs))(
        full.generate(q, n=n, temperature=1.0, max_new_tokens=8, seed=s)[0]))
    first = pol.generate(q, n=n, temperature=1.0, max_new_tokens=8, seed=seed, sessions=["a"])[0]
    assert len({tuple(c.token_ids) for c in first}) == n                      # three different branches
    assert all(pol.tokenizer.encode(c.text) == c.token_ids for c in first)   # each one's text re-encodes
    slot2, held2 = sess.branches["a"][2]
    prompt = "question: which branch?\n" + first[2].text + "obs: seen\n"
    ids = pol.encode_prompt(prompt, 8)
    assert sess.pick("a", ids) == (slot2, len(held2)) and held2 == first[2].prompt_ids + first[2].token_ids
    pre = pol.prefill_tokens
    b = pol.generate([prompt], n=n, max_new_tokens=8, seed=2, sessions=["a"])
    same(full.generate([prompt], n=n, max_new_tokens=8, seed=2), b, tol=1e-5)
    assert sess.stats["reused"] == 1 and sess.stats["reused_tokens"] == len(held2)
    assert pol.prefill_tokens - pre == fine_bucket(len(ids) - len(held2))      # once, not n times
    assert sess.branches["a"][0][0] == slot2 and sorted(s for s, _ in sess.branches["a"]) == [0, 1, 2]
    other = "question: another thread\n"       # extends no branch: the whole prompt, counted as a fallback
    b = pol.generate([other], n=n, max_new_tokens=8, seed=3, sessions=["a"])
    same(full.generate([other], n=n, max_new_tokens=8, seed=3), b, first_turn=True)
    assert sess.stats["fallback_not_prefix"] == 1 and sess.stats["reused"] == 1


def test_branches_take_a_slot_each_and_leave_together():
    pol = policy(slots=6, tokens=64)
    sess = pol.sessions
    with pytest.raises(PoolFull, match=r"4 sessions x 2 candidates .* pool of 6 slots.*session_slots >= batch x "):
        pol.generate(list("abcd"), n=2, max_new_tokens=4, sessions=list("abcd"))
    assert not sess.stats and not sess.branches                    # a refused call leaves the pool as it was
    pol.generate(["a", "b"], n=3, max_new_tokens=4, sessions=["a", "b"])
    assert sorted(s for k in "ab" for s, _ in sess.branches[k]) == list(range(6))
    freed = {s for s, _ in sess.branches["a"]}
    pol.release(["a"])                                             # all its n slots are free again
    assert "a" not in sess.branches
    pol.generate(["c"], n=3, max_new_tokens=4, sessions=["c"])
    assert {s for s, _ in sess.branches["c"]} == freed and sess.stats["evicted"] == 0
    pol.generate(["d", "b"], n=2, max_new_tokens=4, sessions=["d", "b"])   # b keeps 2 of its 3, d evicts c whole
    assert set(sess.branches) == {"b", "d"} and sess.stats["evicted"] == 1
    assert all(len(sess.branches[k]) == 2 for k in "bd")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rollout_at_n_candidates_keeps_sessions_and_matches_the_plain_path(temperature):
    cfg = RolloutConfig(k=2, batch_size=3, max_steps=3, max_new_tokens=10, temperature=temperature, n_candidates=3)
    agent = EchoSearch(mode="plain", max_doc_chars=40)

    def run(pol):   # a random select, the same draws in both runs
        rng = random.Random(0)
        return rollout(pol, OverlapRetriever(PASSAGES), agent, EXAMPLES, cfg,
                       select=lambda states, cands: [rng.randrange(len(c)) for c in cands])

    plain, pol = run(policy()), policy(slots=3 * 3)
    kept = run(pol)
    for e, f in zip(plain, kept):
        assert len(e.steps) == len(f.steps) == 3
        for s, t in zip(e.steps, f.steps):
            assert s.token_ids == t.token_ids and s.prompt_ids == t.prompt_ids
            assert [c["token_ids"] for c in s.candidates] == [c["token_ids"] for c in t.candidates]
            np.testing.assert_allclose(s.logprobs, t.logprobs, rtol=1e-4, atol=1e-4)
    st = pol.sessions.stats   # a turn continues the picked candidate's branch (unless an EOS id left its text:
    pairs = [(s, t) for e in kept for s, t in zip(e.steps, e.steps[1:])]   # then the longest common prefix)
    picked = [extends(s.prompt_ids + s.token_ids, t.prompt_ids) for s, t in pairs]
    common = [max(shared_prefix(s.prompt_ids + c, t.prompt_ids)   # each branch: the executed one and the others
                  for c in [s.token_ids] + [c["token_ids"] for c in s.candidates]) for s, t in pairs]
    assert st["fallback_new"] == 5 and sum(picked) >= 5 and len(picked) == 10
    assert st["reused"] == sum(c > 0 for c in common) and st["reused_partial"] == st["reused"] - sum(picked)
    assert st["reused_tokens"] == sum(common)
    assert not pol.sessions.branches                               # every finished episode released its slots


def test_shared_prefix_keeps_an_extension_or_a_long_enough_common_head():
    held = list(range(10, 30))                                          # 20 ids: last prompt + completion
    assert shared_prefix(held, held + [7, 8]) == 20                     # an extension: all of them, however short
    assert shared_prefix(held[:3], held[:3] + [7]) == 3
    assert shared_prefix(held, held[:17] + [7, 8, 9]) == 17             # a new tail: the common head (>= 16)
    assert shared_prefix(held, held[:15] + [7, 8, 9]) == 0              # too short a head: a full prefill
    assert shared_prefix(held, held[:17] + [7], minimum=18) == 0
    assert shared_prefix(held, held[:17] + [7], minimum=0) == 0         # 0: extensions only
    assert shared_prefix(held, held[:18]) == 17                         # a prefix of the held ids: one id prefilled
    assert shared_prefix(held, held) == 19
    assert shared_prefix([], [1, 2]) == 0 and shared_prefix(held, [10]) == 0
    assert shared_prefix(held, held[:17] + [7] * 51) == 17                # a quarter of the new prompt: kept
    assert shared_prefix(held, held[:17] + [7] * 52) == 0                 # less than a quarter: a full prefill
