"""SmartSearch: novelty, credit with a fake judge, refinement from the bad step on, curriculum rules, reward table."""
import pytest

from fakes import OverlapRetriever, Passage, ScriptedPolicy
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import ANSWER, QUERY, Action, Doc, Episode, Step
from jaxrag.env.rollout import RolloutConfig
from jaxrag.supervision import smartsearch as ss
from jaxrag.supervision.judge_protocol import JudgeResult
from jaxrag.supervision.rewards import get_reward

AGENT = get_agent("smartsearch", mode="plain")


def doc(i):
    return Doc(f"d{i}", 1.0, f"T{i}", f"text {i}")


def episode(qid, searches, answer, gold=("gold",), goods=None, useful=None, invalid_at=None):
    """searches: [(query, [doc numbers])]; goods: S_t per search (stored as credit) or None (no credit)."""
    steps = [Step(Action(QUERY, q, f"search: {q}"), docs=[doc(i) for i in ds]) for q, ds in searches]
    if invalid_at is not None:
        steps.insert(invalid_at, Step(Action.invalid("???", "bad")))
    if answer is not None:
        steps.append(Step(Action(ANSWER, answer, f"answer: {answer}")))
    ep = Episode(qid, f"question {qid}?", list(gold), agent="smartsearch", steps=steps, answer=answer,
                 done="answer" if answer is not None else "max_steps")
    if goods is not None:
        idx = ss.search_steps(ep)
        ep.metadata[ss.CREDIT_KEY] = [
            ss.StepCredit(i, ep.steps[i].action.text, 0, 1, g if useful is None else useful[t], g, "").to_json()
            for t, (i, g) in enumerate(zip(idx, goods))]
    return ep


class FakeJudge:
    """Replies from a function of the request; records every call (one list per batched call)."""
    name = "fake"

    def __init__(self, reply):
        self.reply, self.calls = reply, []

    def judge(self, requests):
        self.calls.append(list(requests))
        return [self.reply(r) for r in requests]


# ---- credit ---------------------------------------------------------------------------------------------------------
def test_novelty_overlap_counts_and_threshold():
    ep = episode("q", [("a", [1, 2, 3]), ("b", [2, 4, 5]), ("c", [1, 2, 6]), ("d", [7, 8, 9])], "x")
    assert ss.overlaps(ep) == [0, 1, 2, 0]
    assert ss.novelty(ep, threshold=1) == [1, 1, 0, 1]
    assert ss.novelty(ep, threshold=0) == [1, 0, 0, 1]
    assert ss.novelty(ep, threshold=2) == [1, 1, 1, 1]
    # documents without an id are the same document when title and text are
    e2 = Episode("q", "?", ["g"], steps=[Step(Action(QUERY, "a"), docs=[Doc("", 0, "T", "x"), Doc("", 0, "U", "y")]),
                                         Step(Action(QUERY, "b"), docs=[Doc("", 0, "T", "x"), Doc("", 0, "T", "z")])])
    assert ss.overlaps(e2) == [0, 1]


def test_assess_combines_novelty_and_judge_in_one_batched_call():
    ep = episode("q", [("a", [1, 2]), ("b", [3]), ("c", [1, 2, 3])], "gold")
    replies = {0: JudgeResult(None, failure="timeout after 30s"), 1: JudgeResult([0.0], rationale="no birth date"),
               2: JudgeResult([1.0], rationale="found it")}
    judge = FakeJudge(lambda r: replies[r.metadata["step"]])
    (credits,) = ss.assess([ep], judge)
    assert len(judge.calls) == 1 and [r.kind for r in judge.calls[0]] == ["usefulness"] * 3
    r1 = judge.calls[0][1]
    assert r1.gold == ["gold"] and r1.candidates[0].text == "b"
    assert [s.action.text for s in r1.state.history] == ["a", "b"]
    assert [(c.overlap, c.novel, c.useful, c.good) for c in credits] == [(0, 1, None, 1), (0, 1, 0, 0), (3, 0, 1, 0)]
    assert credits[0].failure == "timeout after 30s"  # recorded; S_t rests on novelty (the code counts it good)
    assert [c.explanation for c in credits] == ["the query is novel.", "the query is novel. no birth date",
                                               "the query is redundant. found it"]
    assert ep.metadata[ss.CREDIT_KEY][1]["explanation"] == "the query is novel. no birth date"
    code = ss.assess([ep], judge, ss.SmartSearchConfig(explanations="code"))[0]
    assert [c.explanation for c in code] == ["", "no birth date", ss.CODE_REDUNDANT_TEXT]
    # no judge at all: novelty only, nothing recorded as a failure
    nov = ss.assess([ep])[0]
    assert [(c.useful, c.good, c.failure) for c in nov] == [(None, 1, ""), (None, 1, ""), (None, 0, "")]
    recs = ss.credit_records([ep], AGENT)
    assert [r.step for r in recs] == [0, 1, 2] and [r.candidates[0].score for r in recs] == [1.0, 1.0, 0.0]
    assert recs[1].prompt == AGENT.render(ep.state(1)) and recs[0].source == "smartsearch"


# ---- refinement -----------------------------------------------------------------------------------------------------
PASSAGES = [Passage(f"p{i}", f"Title {i}", f"topic{i} fact") for i in range(10)]


def test_refinement_regenerates_only_from_the_bad_step():
    def respond(prompt, j):
        return "answer: gold\n" if "search: refined" in prompt else "search: topic9\n"

    pol = ScriptedPolicy(respond)
    eps = [episode("q1", [("topic1", [1]), ("topic2 bad", [2]), ("topic3", [3])], "wrong", goods=[1, 0, 1]),
           episode("q2", [("topic4 bad", [4])], "wrong", goods=[0])]
    for e in eps:
        for c in e.metadata[ss.CREDIT_KEY]:
            c["explanation"] = f"issue of {c['query']}"

    def refine_reply(r):
        if r.metadata["qid"] == "q2":
            return JudgeResult(None, failure="unparseable reply: 'hmm'")
        return JudgeResult([1.0], texts=[f"refined {r.candidates[0].text}"])

    refiner = FakeJudge(refine_reply)
    out = ss.refine(eps, refiner, pol, OverlapRetriever(PASSAGES), AGENT, RolloutConfig(k=2, max_steps=6))
    assert len(refiner.calls) == 1 and [(r.kind, r.metadata["step"]) for r in refiner.calls[0]] == [("refine", 1),
                                                                                                   ("refine", 0)]
    req = refiner.calls[0][0]
    assert req.explanation == "issue of topic2 bad" and len(req.state.history) == 2 and req.gold == []
    assert out.failures == [{"qid": "q2", "step": 0, "failure": "unparseable reply: 'hmm'"}] and out.requests == 2
    (new,) = out.episodes
    orig = eps[0]
    assert new.steps[0].action == orig.steps[0].action and new.steps[0].docs == orig.steps[0].docs
    assert new.steps[1].action.text == "refined topic2 bad"
    assert new.steps[1].action.extra["original_query"] == "topic2 bad" and new.steps[1].docs  # retrieved anew
    assert [s.action.text for s in new.steps[2:]] == ["gold"] and new.answer == "gold" and new.done == "answer"
    assert new.metadata[ss.REFINED_KEY]["step"] == 1 and ss.CREDIT_KEY not in new.metadata
    # the policy only generated after the refined step: one call, whose prompt holds both kept steps
    assert len(pol.calls) == 1 and "search: topic1\n" in pol.calls[0]["prompts"][0]
    assert "search: refined topic2 bad\n" in pol.calls[0]["prompts"][0]
    with pytest.raises(ValueError, match="no credit"):
        ss.refine([episode("q3", [("a", [1])], "x")], refiner, pol, OverlapRetriever(PASSAGES), AGENT)


def test_a_refinement_that_keeps_the_query_is_a_failure_not_a_trajectory():
    """A refiner may hand back the bad query itself (the synthetic oracle does when BM25 missed the hop's passage):
    regenerating from it would not be a refinement, so it is recorded as a failure and nothing is rolled out."""
    pol = ScriptedPolicy(lambda prompt, j: "answer: gold\n")
    ep = episode("q1", [("topic1", [1]), ("topic2", [2])], "wrong", goods=[1, 0])
    refiner = FakeJudge(lambda r: JudgeResult([1.0], texts=[f" {r.candidates[0].text} "]))
    out = ss.refine([ep], refiner, pol, OverlapRetriever(PASSAGES), AGENT, RolloutConfig(k=2, max_steps=6))
    assert out.episodes == [] and out.requests == 1 and pol.calls == []
    assert out.failures == [{"qid": "q1", "step": 1, "failure": "refined query equals the original"}]


# ---- curriculum -----------------------------------------------------------------------------------------------------
def test_sft_filter_hand_cases():
    keep = episode("a", [("x", [1]), ("y", [2])], "gold", goods=[1, 1])
    one_bad = episode("b", [("x", [1]), ("y", [2])], "gold", goods=[1, 0])
    wrong = episode("c", [("x", [1])], "nope", goods=[1])
    unjudged = episode("d", [("x", [1])], "gold", goods=[1], useful=[None])
    no_credit = episode("e", [("x", [1]), ("y", [2])], "gold")
    broken = episode("f", [("x", [1])], "gold", goods=[1], invalid_at=1)
    eps = [keep, one_bad, wrong, unjudged, no_credit, broken]
    assert [e.qid for e in ss.sft_filter(eps)] == ["a"]
    loose = ss.SmartSearchConfig(require_judged=False)
    assert [e.qid for e in ss.sft_filter(eps, loose)] == ["a", "d", "e"]


def test_dpo_pair_rules_hand_cases():
    y0 = episode("q", [("a", [1]), ("b", [2])], "nope", goods=[1, 0])        # incorrect, 1 good
    y1 = episode("q", [("c", [1]), ("d", [2])], "gold", goods=[0, 0])        # correct, 2 bad
    y2 = episode("q", [("e", [1])], "gold", goods=[1])                       # correct, 0 bad
    y3 = episode("q", [("f", [1]), ("g", [2])], "nope", goods=[1, 1])        # incorrect, 2 good
    keys = [ss.preference_key(y) for y in (y0, y1, y2, y3)]
    assert keys == [(0, 1), (1, -2), (1, 0), (0, 2)]
    assert sorted(range(4), key=lambda i: keys[i], reverse=True) == [2, 1, 3, 0]
    tie_a = episode("r", [("h", [1])], "gold", goods=[1])
    tie_b = episode("r", [("i", [1])], "gold", goods=[1])
    (pair,) = ss.dpo_pairs([y0, y1, y2, y3, tie_a, tie_b], AGENT)  # one pair per question; "r" ties: none
    text = {id(y): ss.trajectory_text(y, AGENT) for y in (y0, y1, y2, y3)}
    assert (pair.chosen, pair.rejected) == (text[id(y2)], text[id(y0)]) and pair.qid == "q"
    assert pair.margin == pytest.approx(1.0 - 0.1) and pair.source == "smartsearch"
    assert pair.prompt == AGENT.render(y0.state(0)) and pair.chosen == "search: e\nresult: T1: text 1\nanswer: gold"
    every = ss.dpo_pairs([y0, y1, y2, y3], AGENT, ss.SmartSearchConfig(pairs="all"))
    names = {text[id(y)]: n for y, n in ((y0, "y0"), (y1, "y1"), (y2, "y2"), (y3, "y3"))}
    assert {(names[p.chosen], names[p.rejected]) for p in every} == {
        ("y1", "y0"), ("y2", "y0"), ("y3", "y0"), ("y2", "y1"), ("y1", "y3"), ("y2", "y3")}


# ---- composite reward -----------------------------------------------------------------------------------------------
def chat_episode(n_good, n_bad, answer, boxed=True, bad_tag=False):
    steps = []
    for i in range(n_good + n_bad):
        raw = f"<think> step {i} </think>\n<search> q{i} </search" + ("<" if bad_tag and i == 0 else ">")
        steps.append(Step(Action(QUERY, f"q{i}", raw), docs=[doc(i)]))
    body = f"\\boxed{{{answer}}}" if boxed else answer
    steps.append(Step(Action(ANSWER, answer, f"<think> done </think>\n<answer> The final answer is {body} </answer>")))
    ep = Episode("q", "?", ["gold answer"], agent="smartsearch", steps=steps, answer=answer, done="answer")
    goods = [1] * n_good + [0] * n_bad
    ep.metadata[ss.CREDIT_KEY] = [ss.StepCredit(i, f"q{i}", 0, 1, g, g, "").to_json() for i, g in enumerate(goods)]
    return ep


@pytest.mark.parametrize("n_good,n_bad,answer,boxed,expect", [
    (2, 0, "gold answer", True, 1.0 + 0.1),           # correct, 0 wrong
    (1, 3, "gold answer", True, 0.7 + 0.1),           # correct, 3 wrong: 1 - 0.3
    (0, 5, "gold answer", True, 0.7 + 0.1),           # correct, 5 wrong: max(0.5, φ_min = 0.7)
    (0, 2, "paris", True, 0.0 + 0.1),                 # incorrect, 0 good
    (2, 1, "paris", True, 0.2 + 0.1),                 # incorrect, 2 good
    (5, 0, "paris", True, 0.3 + 0.1),                 # incorrect, 5 good: min(0.5, φ_max = 0.3)
    (1, 0, "gold answer here", True, 1.0 + 0.1),      # F1 = 0.8 counts as correct
    (1, 0, "gold x y", True, 0.1 + 0.1),              # F1 = 0.4: incorrect with 1 good
    (2, 0, "gold answer", False, 0.2),                 # no \boxed{}: no answer (the released code reads only
    # \boxed), so incorrect with 2 good queries, and no format bonus
])
def test_composite_reward_table(n_good, n_bad, answer, boxed, expect):
    r = ss.smartsearch_reward(chat_episode(n_good, n_bad, answer, boxed))
    assert r.total == pytest.approx(expect)
    assert r.components["format"] == float(boxed) and r.components["n_wrong"] == n_bad
    assert r.components["judged"] == 1.0


def test_reward_registry_label_sources_and_malformed_tag():
    fn = get_reward("smartsearch")
    assert fn(chat_episode(2, 0, "gold answer")).total == pytest.approx(1.1)
    assert fn(chat_episode(2, 0, "gold answer", bad_tag=True)).total == 0.0  # "</search<" zeroes it (code)
    # no credit: novelty only (step 2 re-retrieves 2 of step 1's docs: redundant), then per-step useful labels
    ep = episode("q", [("a", [1, 2]), ("b", [1, 2, 3])], "gold")
    r = fn(ep)
    assert (r.components["n_wrong"], r.components["judged"], r.total) == (1.0, 0.0, pytest.approx(0.9 + 0.1))
    ep.steps[0].action.extra["useful"] = 0
    r = fn(ep)
    assert (r.components["n_wrong"], r.components["judged"]) == (2.0, 1.0) and r.total == pytest.approx(0.8 + 0.1)
    # format in the plain line world: an Invalid step loses the bonus
    assert fn(episode("q", [("a", [1])], "gold", invalid_at=1)).components["format"] == 0.0


def test_outcome_reward_ignores_the_process_labels():
    """Eq. 5 (the "w/o process rewards" rows): r_outcome (F1 >= 0.8) + 0.1·r_format, whatever the queries' S_t."""
    fn = get_reward("smartsearch_outcome")
    assert fn(chat_episode(0, 3, "gold answer")).total == pytest.approx(1.1)  # 3 bad queries: "smartsearch" gives 0.8
    assert fn(chat_episode(3, 0, "wrong")).total == pytest.approx(0.1)  # 3 good queries: composite would add 0.3
    assert fn(chat_episode(1, 0, "gold answer", boxed=False)).total == pytest.approx(0.0)  # no \\boxed: no answer
    assert fn(chat_episode(2, 0, "gold answer", bad_tag=True)).total == 0.0
    r = fn(chat_episode(0, 1, "gold answer"))
    assert r.components == {"outcome": 1.0, "f1": 1.0, "format": 1.0}


def test_search_quality_uses_the_labels():
    eps = [episode("a", [("x", [1])], "gold", goods=[1]), episode("b", [("x", [1])], "gold", goods=[0]),
           episode("c", [("x", [1])], "no", goods=[1]), episode("d", [("x", [1])], "no", goods=[0])]
    assert ss.search_quality(eps) == {"perfect": 0.25, "partial": 0.25, "sq": 0.5}


def test_format_rules_of_the_code():
    ok = ("<think> a </think>\n<search> q </search>\n<result>\nx\n</result>\n"
          "<think> b </think><answer> \\boxed{y} </answer>")
    assert ss.tag_format(ok) == (True, "ok")
    assert ss.tag_format(ok.replace("<think> b </think>", "<think> b"))[0] is False
    assert ss.tag_format(ok.replace("<result>\nx\n</result>\n", ""))[0] is False
    assert ss.tag_format(ok + "<answer> again </answer>")[0] is False
    assert ss.tag_format(ok.replace("\\boxed{y}", "y"))[1] == "answer without \\boxed{}"
