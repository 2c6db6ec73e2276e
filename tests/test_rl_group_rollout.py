"""jaxrag.rl.group_rollout: the independent strategy is today's one rollout call; SmartSearch's refinement rollout
gives exactly G per question, <= M per expansion set, refined episodes branching from y0's own prefix, fresh y0s for a
question without a bad query, and the refiner's query tokens trained under the current policy's log-probs."""


import numpy as np
import pytest
from fakes import ScriptedPolicy
from rl_world import QUESTIONS, world

from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import QUERY, Doc, read_episodes
from jaxrag.env.rollout import RolloutConfig, rollout
from jaxrag.rl import RLConfig, train_rl
from jaxrag.rl import group_rollout as GR
from jaxrag.supervision import smartsearch as SS
from jaxrag.supervision.judge_protocol import JudgeResult
from jaxrag.train.metrics_log import read_metrics

AGENT = get_agent("smartsearch", mode="plain")
QS = [{"id": "q0", "question": "who wrote alpha?", "golden_answers": ["gold"]},
      {"id": "q1", "question": "who sang beta?", "golden_answers": ["gold"]}]


class OneDocRetriever:
    """Each query gets one document of its own (no overlap: novelty never flags a query)."""

    def search(self, queries, k):
        return [[Doc(f"d:{q}", 1.0, q, f"about {q}")] for q in queries]


class Judge:
    """Usefulness: a query holding "bad" is useless; refine: "fixed <query without 'bad'>" (or a failure for "unfixable")."""
    name = "fake"

    def __init__(self):
        self.calls = []

    def judge(self, requests):
        self.calls.append([r.kind for r in requests])
        out = []
        for r in requests:
            q = r.candidates[0].text
            if r.kind == "refine":
                out.append(JudgeResult(None, failure="no") if "unfixable" in q else
                           JudgeResult([1.0], texts=[f"fixed {q.replace('bad ', '')}"]))
            else:
                out.append(JudgeResult([float("bad" not in q)], rationale="useless" if "bad" in q else "ok"))
        return out


def script(prompt: str, j: int) -> str:
    """q0 searches "bad one", then "bad two", then answers; q1 searches once (useful) and answers. After a refined
    ("fixed") query the agent answers at once."""
    if "search: fixed" in prompt:
        return "answer: gold\n"
    n = prompt.count("\nsearch: ")
    if "alpha" in prompt:
        return ["search: bad one\n", "search: bad two\n", "answer: wrong\n"][min(n, 2)]
    return "search: good beta\n" if n == 0 else "answer: gold\n"


def sampler(policy, **kw):
    judge = Judge()
    return GR.GroupSampler(policy, OneDocRetriever(), AGENT, judge=judge, refiner=judge,
                           encode=lambda p: [1] + list(p.encode()), tokenize=lambda t: list(t.encode()),
                           score=lambda pairs: [[-0.25 - 0.01 * i for i in range(len(c))] for _, c in pairs], **kw)


RCFG = RolloutConfig(k=1, max_steps=4, batch_size=8, seed=5)


def untimed(ep) -> dict:
    """An episode's JSON without its wall-clock timings."""
    d = ep.to_json()
    d.pop("timing", None)
    for st in d["steps"]:
        st.pop("timing", None)
    return d


def test_independent_is_one_rollout_of_every_question_g_times():
    """One rollout call; with a usefulness judge, every episode's queries credited in ONE judge call (the composite
    reward's S_t, as SmartSearch's released reward judges every trajectory)."""
    rc = RLConfig(group_size=3)
    pol_a, pol_b = ScriptedPolicy(script), ScriptedPolicy(script)
    stats: dict = {}
    gs = sampler(pol_a)
    got = GR.sample_groups(gs, QS, rc, RCFG, stats)
    want = rollout(pol_b, OneDocRetriever(), AGENT, [q for q in QS for _ in range(3)], RCFG)
    assert gs.judge.calls == [["usefulness"] * (3 * 2 + 3 * 1)]   # q0: 2 searches, q1: 1, each 3 times
    assert [[c["good"] for c in e.metadata.pop(SS.CREDIT_KEY)] for e in got] == [[0, 0]] * 3 + [[1]] * 3
    assert [untimed(e) for e in got] == [untimed(e) for e in want]
    assert [e.qid for e in got] == ["q0"] * 3 + ["q1"] * 3
    assert [len(c["prompts"]) for c in pol_a.calls] == [len(c["prompts"]) for c in pol_b.calls]
    assert stats["episodes"] == 6 and "generate_s" in stats


def test_refine_groups_hold_g_per_question_and_at_most_m_per_set():
    rc = RLConfig(group_size=3, group_rollout="smartsearch_refine", refine_keep_m=2, refine_query_loss=False)
    pol = ScriptedPolicy(script)
    gs = sampler(pol)
    stats: dict = {}
    eps = GR.sample_groups(gs, QS, rc, RCFG, stats)
    assert [e.qid for e in eps] == ["q0"] * 3 + ["q1"] * 3
    tags = [(e.metadata[GR.GROUP_KEY]["round"], e.metadata[GR.GROUP_KEY]["member"]) for e in eps]
    # q0: {y0, y1} in round 0 (M = 2 of its 3-set {y0, "fixed one", "fixed two"}), then y0 of round 1 (cut
    # at G); q1 has no bad query: a fresh y0 in each of 3 rounds
    assert tags == [(0, 0), (0, 1), (1, 0), (0, 0), (1, 0), (2, 0)]
    y0, y1 = eps[0], eps[1]
    branch = y1.metadata[SS.REFINED_KEY]
    assert branch["step"] == 0 and branch["original_query"] == "bad one"  # the earliest bad query first
    assert y1.steps[0].action.text == "fixed one" and y1.steps[0].action.extra["refined"]
    assert y1.steps[0].docs == [Doc("d:fixed one", 1.0, "fixed one", "about fixed one")]
    assert y1.answer == "gold" and y0.answer == "wrong"
    # the y0 rollout of each round is ONE call over every question still short of G
    y0_calls = [c for c in pol.calls if all("search:" not in p for p in c["prompts"])]
    assert [len(c["prompts"]) for c in y0_calls] == [2, 2, 1]
    # credit of every kept episode (the composite reward's S_t): y0 judged in its round, y1 after
    assert [c["good"] for c in y0.metadata[SS.CREDIT_KEY]] == [0, 0]
    assert [c["good"] for c in y1.metadata[SS.CREDIT_KEY]] == [1]
    assert stats["refined_episodes"] == 1 and stats["refine_rounds"] == 3 and stats["refine_requests"] == 4
    # refine_query_loss False: the refined step has no generated ids, so it gives no row (no loss)
    assert y1.steps[0].token_ids == [] and y1.steps[0].logprobs == []


def test_refined_prefix_is_y0s_own_and_m_3_keeps_both_refinements():
    def script2(prompt, j):  # q0 searches twice before answering; the refinement of the 2nd regenerates from there
        if "search: fixed" in prompt:
            return "answer: gold\n"
        n = prompt.count("\nsearch: ")
        return ["search: good one\n", "search: bad two\n", "answer: wrong\n"][min(n, 2)]

    rc = RLConfig(group_size=2, group_rollout="smartsearch_refine", refine_keep_m=3, refine_query_loss=False)
    eps = GR.sample_groups(sampler(ScriptedPolicy(script2)), QS[:1], rc, RCFG, {})
    y0, y1 = eps
    assert y1.metadata[SS.REFINED_KEY]["step"] == 1
    assert y1.steps[0].action == y0.steps[0].action and y1.steps[0].docs == y0.steps[0].docs  # y0's prefix
    assert y1.steps[0].token_ids == y0.steps[0].token_ids and y1.steps[0].prompt == y0.steps[0].prompt
    assert y1.steps[1].action.text == "fixed two" and y1.steps[1].action.extra["original_query"] == "bad two"
    assert y1.steps[2].prompt.endswith("search: fixed two\n") or "search: fixed two" in y1.steps[2].prompt

    # M = 3 with two bad queries: the set is {y0, fixed 1st, fixed 2nd}; a failed refinement is not counted
    rc = RLConfig(group_size=3, group_rollout="smartsearch_refine", refine_keep_m=3, refine_query_loss=False)
    eps = GR.sample_groups(sampler(ScriptedPolicy(script)), QS[:1], rc, RCFG, {})
    assert [e.metadata.get(SS.REFINED_KEY, {}).get("original_query") for e in eps] == [None, "bad one", "bad two"]
    assert len({e.metadata[GR.GROUP_KEY]["round"] for e in eps}) == 1


def test_refiner_query_tokens_get_the_current_policys_logprobs():
    """refine_query_loss (the released code: loss_mask 1 and actor-recomputed old log-probs on the refined query): the
    refined step's ids are the tokenizer's ids of its text after the sampler's prompt ids, its log-probs the
    scorer's, not a sampler's; the policy's own steps keep the sampler's log-probs (-0.5 from the scripted policy)."""
    rc = RLConfig(group_size=2, group_rollout="smartsearch_refine", refine_keep_m=2, refine_query_loss=True)
    eps = GR.sample_groups(sampler(ScriptedPolicy(script)), QS[:1], rc, RCFG, {})
    y0, y1 = eps
    st = y1.steps[0]
    assert st.token_ids == list(st.action.raw.encode()) and st.action.raw == "search: fixed one"
    assert st.prompt_ids == [1] + list(st.prompt.encode())
    np.testing.assert_allclose(st.logprobs, [-0.25 - 0.01 * i for i in range(len(st.token_ids))])
    assert st.finish_reason == "refined"
    assert set(y1.steps[1].logprobs) == {-0.5} and all(set(s.logprobs) == {-0.5} for s in y0.steps)


def test_refine_needs_a_refiner_and_config_checks_name_the_key():
    rc = RLConfig(group_size=2, group_rollout="smartsearch_refine")
    with pytest.raises(ValueError, match="needs a refiner"):
        GR.sample_groups(GR.GroupSampler(ScriptedPolicy(script), OneDocRetriever(), AGENT), QS, rc, RCFG, {})
    with pytest.raises(ValueError, match=r"rl config: group_rollout: 'refined' is not one of \('independent', "
                                         r"'smartsearch_refine'\)"):
        RLConfig.from_dict({"group_rollout": "refined"})
    with pytest.raises(ValueError, match=r"rl config: refine_keep_m: must be >= 1"):
        RLConfig.from_dict({"refine_keep_m": 0})


def test_rl_stage_check_needs_a_judge_for_the_refinement_rollout():
    from configs.smartsearch import grpo as grpo_cfg
    from jaxrag.pipelines.rl import check_config

    c = grpo_cfg.get_config("smoke")
    c.rl.rl.group_rollout = "smartsearch_refine"
    del c.rl["judge"]   # the smoke's local usefulness judge
    with pytest.raises(ValueError, match=r"rl\.judge.*needs a judge section"):
        check_config(c, "rl")
    c.rl.judge = {"kind": "http", "base_url": "", "model": ""}
    with pytest.raises(ValueError, match=r"rl\.judge.*base_url and model"):
        check_config(c, "rl")


class AllBadJudge:
    """Every query is useless; refine: "zz" + the query's first 6 characters."""
    name = "all_bad"

    def judge(self, requests):
        return [JudgeResult([1.0], texts=["zz" + r.candidates[0].text[:6]]) if r.kind == "refine"
                else JudgeResult([0.0], rationale="useless") for r in requests]


def test_train_rl_refine_step_trains_the_refined_tokens_at_ratio_one(tmp_path):
    """One GRPO step of the tiny world with the refinement rollout: 2 groups of 2; refined queries' tokens are rows
    of the update (row_tokens counts them) and, their old log-probs being the current policy's, ratio 1 everywhere
    on the first inner step; the loss is the token-mean -Σ A_e n_e / Σ n_e over every trained token."""
    policy, retriever, agent = world(seed=2)
    rc = RLConfig(steps=1, questions_per_step=2, group_size=2, temperature=1.0, max_new_tokens=4, max_steps=2, k=1,
                  seed=3, group_rollout="smartsearch_refine", refine_keep_m=2)
    tc = {"loss": "grpo", "seq_buckets": (256,), "optimizer": {"lr": 1e-2}, "progress": False,
          "grpo": {"beta": 0.0, "aggregation": "token_mean"}, "checkpoint": {"enabled": False}}
    judge = AllBadJudge()
    res = train_rl(policy, retriever, agent, QUESTIONS, "test_ascii", rc, tc, tmp_path, judge=judge, refiner=judge)
    eps = read_episodes(tmp_path / "episodes.jsonl")
    assert len(eps) == 4 and [e.qid for e in eps][::2] == [e.qid for e in eps][1::2]
    refined = [e for e in eps if SS.REFINED_KEY in e.metadata]
    # the random model's first action is a search (EchoAgent), every query is bad: each group is {y0, its y1}
    assert [e.metadata[GR.GROUP_KEY]["member"] for e in eps] == [0, 1, 0, 1] and refined == eps[1::2]
    for e in refined:
        st = e.steps[e.metadata[SS.REFINED_KEY]["step"]]
        assert st.action.kind == QUERY and st.action.text.startswith("zz") and st.finish_reason == "refined"
        assert len(st.token_ids) == len(st.logprobs) > 0
    m = read_metrics(tmp_path / "metrics.jsonl")[1]
    n = np.array([sum(len(s.token_ids) for s in e.steps) for e in eps])
    r = np.array([e.reward for e in eps]).reshape(2, 2)
    adv = ((r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-4)).ravel()
    assert m["row_tokens"] == n.sum()  # the refined tokens are trained
    assert m["ratio_max_dev"] < 1e-3  # ... under the current policy's own log-probs
    np.testing.assert_allclose(m["loss"], -np.sum(adv * n) / n.sum(), rtol=1e-4, atol=1e-6)
    assert m["refine/refined_episodes"] == len(refined) and "time/judge_s" in m
    assert res.step == 1
