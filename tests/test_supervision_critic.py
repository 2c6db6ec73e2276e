"""PRM-guided best-of-N: CriticScorer scores equal critic_scores on the same tokens (and on the Bradley–Terry
trainer's own batches), the select hook executes the argmax, and the critic tokenizes with its own tokenizer."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fakes import OverlapRetriever, Passage, ScriptedPolicy
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import Action, State
from jaxrag.env.rollout import Candidate, RolloutConfig, rollout
from jaxrag.models import critic_scores, param_shapes
from jaxrag.models.config import ModelConfig
from jaxrag.supervision.critic import CriticScorer, CriticSelect, _score_fn, critic_select, score_records
from jaxrag.supervision.records import Pair, ProcessRecord, ScoredCandidate, pair_examples
from jaxrag.train.batching import pair_batch


class ShiftTokenizer:
    """Another 'model family': bytes shifted by 40 in a 300-token vocabulary; counts its encode calls."""
    pad_id, bos_id, eos_id, vocab_size = 0, 1, 2, 300

    def __init__(self):
        self.calls = 0

    def encode(self, text, add_bos=False):
        self.calls += 1
        return ([1] if add_bos else []) + [40 + b for b in text.encode("utf-8")]


CFG = ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64,
                  max_seq_len=256, bos_id=1, eos_ids=(2,), pad_id=0)


@pytest.fixture(scope="module")
def critic():
    """A random critic, initialized on the host (no compile): normal(0.5) matrices, unit norms, head bias 0.3."""
    rng = np.random.default_rng(0)

    def leaf(name, shape):
        return jnp.ones(shape, jnp.float32) if "norm" in name else jnp.asarray(rng.normal(0, 0.5, shape), jnp.float32)

    shapes = param_shapes(CFG)
    params = {k: ({n: leaf(n, s) for n, s in v.items()} if isinstance(v, dict) else leaf(k, v)) for k, v in shapes.items()}
    head = {"w": jnp.asarray(rng.normal(0, 0.2, CFG.d_model), jnp.float32), "b": jnp.asarray(0.3, jnp.float32)}
    return CFG, params, head


_REF = jax.jit(critic_scores, static_argnums=0)


def _reference(cfg, params, head, rows):
    """critic_scores on equal-length rows, unpadded, read at the last token (the default)."""
    assert len({len(r) for r in rows}) == 1, "reference rows must have one length (one compile, no padding)"
    return np.asarray(_REF(cfg, params, head, jnp.asarray(rows, jnp.int32)))


# three (prompt, action) texts of one token length, so the reference needs no padding and one compile
PROMPTS = ["question: a\n", "q: b\nsearch: x\n", "q: c\n"]
ACTIONS = ["search: y", "answer", "answer: long ans"]


def test_scores_equal_critic_scores_on_the_same_tokens(critic):
    cfg, params, head = critic
    tok = ShiftTokenizer()
    want = _reference(cfg, params, head, [tok.encode(p, add_bos=True) + tok.encode(a) for p, a in zip(PROMPTS, ACTIONS)])
    scorer = CriticScorer(cfg, params, head, tok, batch_size=8)
    np.testing.assert_allclose(scorer.score_texts(PROMPTS, ACTIONS), want, rtol=1e-5, atol=1e-5)
    assert scorer.shapes == {(4, 64)}  # 3 rows -> 4 (power of two), longest row -> the 64-column bucket
    small = CriticScorer(cfg, params, head, tok, batch_size=2)  # chunks of 2, order restored
    np.testing.assert_allclose(small.score_texts(PROMPTS, ACTIONS), want, rtol=1e-5, atol=1e-5)
    assert small.shapes == {(2, 64), (1, 64)}


def test_same_input_as_the_bradley_terry_trainer(critic):
    cfg, params, head = critic
    tok = ShiftTokenizer()
    pair = Pair(PROMPTS[1], ACTIONS[0], ACTIONS[2], 0.7, "rank:oracle")
    b = pair_batch(pair_examples([pair], tok), buckets=(64, 128))
    t = b["tokens"].shape[-1]
    # what the trainer's bt step computes on its batch (jitted critic_scores; shares a compiled shape)
    trainer = _score_fn(cfg)(params, head, b["tokens"].reshape(-1, t), b["positions"].reshape(-1, t),
                             b["segment_ids"].reshape(-1, t), jnp.asarray(b["read_index"].reshape(-1)))
    scorer = CriticScorer(cfg, params, head, tok)
    np.testing.assert_allclose(scorer.score_texts([pair.prompt] * 2, [pair.chosen, pair.rejected]), trainer,
                               rtol=1e-5, atol=1e-5)


def test_overlong_input_drops_the_prompt_middle_and_keeps_the_action():
    scorer = CriticScorer(dataclasses.replace(CFG, max_seq_len=64), None, None, ShiftTokenizer())
    ids = scorer.encode("BEGIN" + "x" * 100 + "END", "answer: y")
    head = ShiftTokenizer().encode("BEGIN", add_bos=True)
    tail = ShiftTokenizer().encode("END") + ShiftTokenizer().encode("answer: y")
    assert len(ids) == 64 and ids[:len(head)] == head and ids[-len(tail):] == tail
    assert scorer.fits(9)("x" * 54) and not scorer.fits(9)("x" * 55)  # 1 BOS + 54 + 9 = 64


def test_best_of_n_executes_the_argmax_with_the_critics_own_tokenizer(critic):
    cfg, params, head = critic
    agent = get_agent("react", mode="plain")
    item = {"id": "q", "question": "Who founded Acme?", "golden_answers": ["Bob"]}
    texts = ["answer: Bob", "answer: Ann", "answer: Cal", "answer: Dan", "answer: Eve"]
    prompt = agent.render(State(item["question"], qid="q"))
    tok = ShiftTokenizer()
    ref = _reference(cfg, params, head, [tok.encode(prompt, add_bos=True) + tok.encode(t) for t in texts]).tolist()
    # put the critic's favourite at index 2, so a first-candidate pick cannot pass
    order = sorted(range(len(texts)), key=lambda i: -ref[i])
    texts = [texts[i] for i in (order[1], order[2], order[0], order[3], order[4])]
    pol = ScriptedPolicy(lambda p, j: texts[j])  # completions carry byte-level token ids, not the critic's
    scorer = CriticScorer(cfg, params, head, tok, agent, batch_size=4)  # rows 4 + 1: shapes compiled above
    sel = critic_select(scorer)
    ret = OverlapRetriever([Passage("p", "Acme", "Acme was founded by Bob.")])
    [ep] = rollout(pol, ret, agent, [item], RolloutConfig(n_candidates=5, max_steps=3, temperature=1.0), select=sel)
    assert ep.steps[0].action.raw == texts[2] and ep.answer == texts[2][len("answer: "):]
    assert pol.calls[0]["prompts"] == [prompt] and tok.calls > 0
    np.testing.assert_allclose(sel.last[0], [ref[i] for i in (order[1], order[2], order[0], order[3], order[4])],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch_size", [16, 3])  # one call; chunks of states (one state over the cap alone)
def test_shared_prefix_scores_equal_whole_sequence_scores(critic, batch_size):
    cfg, params, head = critic
    tok = ShiftTokenizer()
    prompts = ["q: a\n", "question: who made the film Zed?\nsearch: Zed\n", "q: c\nsearch: x\ndoc: y\n"]
    actions = [["search: y", "answer", "answer: long ans"], ["a"], ["search: film Zed director", "answer: Bob", "s", "t"]]
    p_ids = [tok.encode(p, add_bos=True) for p in prompts]
    a_ids = [[tok.encode(a) for a in acts] for acts in actions]
    scorer = CriticScorer(cfg, params, head, tok, batch_size=batch_size)
    want = scorer.score_ids([p + a for p, acts in zip(p_ids, a_ids) for a in acts])
    got = scorer.score_shared(p_ids, a_ids)
    assert [len(g) for g in got] == [3, 1, 4]
    np.testing.assert_allclose(np.concatenate(got), want, rtol=1e-5, atol=1e-5)
    shared_calls = [s for s in scorer.shapes if s[0] == "shared"]
    assert len(shared_calls) == (1 if batch_size == 16 else 3)  # 3: states of 1, 3 and 4 candidates in chunks of 3


def test_min_rows_pads_every_batch_and_keeps_the_scores(critic):
    """min_rows (the tiny pipeline's few compiled programs): batches padded to >= min_rows rows (and prompt rows),
    capped at batch_size; the scores do not change."""
    cfg, params, head = critic
    tok = ShiftTokenizer()
    p_ids = [tok.encode(p, add_bos=True) for p in PROMPTS]
    a_ids = [[tok.encode(a)] for a in ACTIONS]
    plain = CriticScorer(cfg, params, head, tok, batch_size=32)
    floored = CriticScorer(cfg, params, head, tok, batch_size=32, min_rows=8)
    np.testing.assert_allclose(floored.score_ids([p + a[0] for p, a in zip(p_ids, a_ids)]),
                               plain.score_ids([p + a[0] for p, a in zip(p_ids, a_ids)]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.concatenate(floored.score_shared(p_ids, a_ids)),
                               np.concatenate(plain.score_shared(p_ids, a_ids)), rtol=1e-5, atol=1e-5)
    assert {s[0] for s in plain.shapes if s[0] != "shared"} == {4}
    assert {s[0] for s in floored.shapes if s[0] != "shared"} == {8}
    assert {(s[1], s[3]) for s in floored.shapes if s[0] == "shared"} == {(8, 8)}   # prompt rows, candidate rows
    assert CriticScorer(cfg, params, head, tok, batch_size=4, min_rows=64).min_rows == 4
    with pytest.raises(ValueError, match="min_rows=0"):
        CriticScorer(cfg, params, head, tok, min_rows=0)


def test_score_states_shares_the_prompt_and_falls_back_for_inputs_that_do_not_fit(critic):
    cfg, params, head = critic
    agent = get_agent("react", mode="plain")
    tok = ShiftTokenizer()
    states = [State("Who founded Acme?", qid="a"), State("Where is Zed?", qid="b")]
    texts = [["answer: Bob", "search: Acme founder"], ["answer: Paris"]]
    scorer = CriticScorer(cfg, params, head, tok, agent, batch_size=8)
    got = scorer.score_states(states, texts)
    assert any(s[0] == "shared" for s in scorer.shapes)
    prompts = [agent.render(s) for s in states]
    want = scorer.score_texts([prompts[0]] * 2 + [prompts[1]], [t for ts in texts for t in ts])
    np.testing.assert_allclose(np.concatenate(got), want, rtol=1e-5, atol=1e-5)
    short = CriticScorer(dataclasses.replace(cfg, max_seq_len=64), params, head, tok, agent, batch_size=8)
    long_action = ["answer: " + "x" * 80]  # cannot fit whole: the per-input path cuts it, as before
    assert short.score_states(states[:1], [long_action])[0].shape == (1,)
    assert not any(s[0] == "shared" for s in short.shapes)
    whole = CriticScorer(cfg, params, head, tok, agent, batch_size=8, share_prefix=False)
    np.testing.assert_allclose(np.concatenate(whole.score_states(states, texts)), want, rtol=1e-5, atol=1e-5)
    assert whole.shapes and not any(s[0] == "shared" for s in whole.shapes)


class _FixedScorer:
    def score_states(self, states, texts):
        return [np.asarray([5.0, 1.0, 2.0, 2.0])]


def test_select_ties_and_valid_only():
    cands = [[Candidate(Action.invalid("??", "bad"), None), Candidate(Action("query", "a"), None),
              Candidate(Action("query", "b"), None), Candidate(Action("answer", "c"), None)]]
    assert CriticSelect(_FixedScorer())([State("q")], cands) == [0]  # plain argmax (RAG-Gym Alg. 1)
    assert CriticSelect(_FixedScorer(), valid_only=True)([State("q")], cands) == [2]  # tie: the first


def test_score_records(critic):
    cfg, params, head = critic
    tok = ShiftTokenizer()
    recs = [ProcessRecord("q", "Q?", ["G"], "react", [], p, [ScoredCandidate(a, Action("answer", a), score=0.5, rank=1)],
                          "rank:oracle") for p, a in zip(PROMPTS, ACTIONS)]
    out = score_records(CriticScorer(cfg, params, head, tok), recs)
    want = _reference(cfg, params, head, [tok.encode(p, add_bos=True) + tok.encode(a) for p, a in zip(PROMPTS, ACTIONS)])
    np.testing.assert_allclose([r.candidates[0].score for r in out], want, rtol=1e-5, atol=1e-5)
    assert all(r.source == "critic" and r.candidates[0].rank == 0 for r in out)
    two = ProcessRecord("q", "Q?", ["G"], "react", [], PROMPTS[0], [recs[0].candidates[0]] * 2, "rank:oracle")
    [o] = score_records(CriticScorer(cfg, params, head, tok), [two])
    assert [c.rank for c in o.candidates] == [0, 1] and o.candidates[0].score == o.candidates[1].score  # ties: order
    assert recs[0].candidates[0].score == 0.5  # the input is not modified


def test_critic_select_needs_an_agent(critic):
    cfg, params, head = critic
    with pytest.raises(ValueError, match="needs an agent"):
        critic_select(CriticScorer(cfg, params, head, ShiftTokenizer()))
