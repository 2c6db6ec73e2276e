"""Cross-turn KV reuse (jaxrag.kv_sessions): the reuse path equals the full-prefill path over multi-turn episodes."""
import jax
import numpy as np
import pytest

from fakes import EchoSearch, Latin1Tokenizer, OverlapRetriever, Passage, tiny_jax_policy
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import QUERY, Action, Doc, State, Step
from jaxrag.env.rollout import RolloutConfig, rollout
from jaxrag.kv_sessions import PoolFull, SessionPool


def policy(slots=0, tokens=None):
    pol = tiny_jax_policy(0, 512, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)
    pol.tokenizer = Latin1Tokenizer()
    if slots:
        pol.sessions = SessionPool(pol.cfg, slots, tokens or pol.cfg.max_seq_len)
    return pol


def same(a, b, first_turn=False):
    for x, y in zip(a, b):
        x, y = x[0], y[0]
        assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
        assert x.prompt_ids == y.prompt_ids
        if first_turn:   # the first turn is generate.sample's own prefill
            assert x.logprobs == y.logprobs
        else:            # later turns: attention over the cache sums in another order
            np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=1e-4, atol=1e-4)


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
        if turn == 0:  # a stop string inside row 0's next completion: tokens after the cut are dropped from its slot
            stop = [a[0][0].text[5]]
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


def test_a_design_that_is_not_append_only_falls_back():
    """Chat ReAct puts the question after the growing history: never a prefix extension, always a full prefill."""
    agent = get_agent("react", mode="chat", tokenizer=Latin1Tokenizer())
    full, reuse = policy(), policy(slots=2)
    states = [State(question="who?"), State(question="where is it?")]
    a = full.generate([agent.render(s) for s in states], max_new_tokens=8)
    b = reuse.generate([agent.render(s) for s in states], max_new_tokens=8, sessions=["a", "b"])
    same(a, b, first_turn=True)
    nxt = [State(question=s.question, history=[Step(Action(QUERY, "q", o[0].text), docs=[Doc("d", 0, "T", "text")])])
           for s, o in zip(states, a)]
    a = full.generate([agent.render(s) for s in nxt], max_new_tokens=8)
    b = reuse.generate([agent.render(s) for s in nxt], max_new_tokens=8, sessions=["a", "b"])
    same(a, b, first_turn=True)   # both turns are full prefills: the plain path exactly
    assert reuse.sessions.stats["fallback_not_prefix"] == 2 and reuse.sessions.stats["reused"] == 0


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
