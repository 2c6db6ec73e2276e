"""RAG-Gym ranking collection (scripted policy + the oracle judge on a tiny synthetic world) and Math-Shepherd
rollout values (a scripted policy whose continuations have known outcomes)."""
import pytest

from fakes import OverlapRetriever, Passage, ScriptedPolicy, SlotScripted
from jaxrag.data.synthetic.questions import generate_questions
from jaxrag.data.synthetic.teacher import QUERY_TEMPLATES
from jaxrag.data.synthetic.world import generate_world
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import Action, Doc, Step
from jaxrag.supervision.judge_protocol import JudgeResult
from jaxrag.supervision.judges import OracleJudge
from jaxrag.supervision.ranking import RankingConfig, collect_ranking, ranking_pairs
from jaxrag.supervision.records import ProcessRecord, ScoredCandidate, read_records, write_records
from jaxrag.supervision.rollout_values import RolloutValueConfig, rollout_values

K = 3


def _good(hop):
    return QUERY_TEMPLATES[hop["relation"]][0].format(e=hop["entity"])


@pytest.fixture(scope="module")
def world():
    w = generate_world(0, n_countries=3, n_cities=6, n_persons=20, n_films=10, n_companies=6)
    qs = generate_questions(w)
    ret = OverlapRetriever([Passage(p.id, p.title, p.contents) for p in w.passages])

    def found(h):
        return {d.doc_id for d in ret.search([_good(h)], K)[0]}

    solvable = next(q for q in qs if q["metadata"]["type"] == "2hop"
                    and all(h["passage_id"] in found(h) for h in q["metadata"]["gold_chain"])
                    and q["metadata"]["gold_chain"][1]["passage_id"] not in found(q["metadata"]["gold_chain"][0]))
    hopeless = next(q for q in qs if q["metadata"]["type"] == "1hop")
    return solvable, hopeless, ret


def _script(solvable, hopeless):
    """Candidate j at a state with n searches done. Solvable question: the only oracle-1.0 candidate is j=2 (the
    next hop's query, or the gold answer); hopeless: useless queries and a wrong answer only."""
    hops = solvable["metadata"]["gold_chain"]

    def respond(prompt, j):
        n = prompt.count("\nsearch: ")
        if solvable["question"] in prompt:
            last = prompt.split("\nsearch: ")[-1].split("\n")[0] if n else None
            return [f"search: zzzz qqqq {n}",
                    f"search: {last}" if last else "answer: nobody",
                    f"search: {_good(hops[n])}" if n < len(hops) else f"answer: {solvable['golden_answers'][0]}",
                    f"answer: {hops[0]['answer']}"][j]
        return [f"search: zzzz {n}", "answer: nobody", "search: qqqq", "search: zzzz"][j]

    return respond


def test_ranking_collection_with_the_oracle(world, tmp_path):
    solvable, hopeless, ret = world
    pol = ScriptedPolicy(_script(solvable, hopeless))
    agent = get_agent("react", mode="plain")
    cfg = RankingConfig(n_candidates=4, max_steps=3, k=K)
    eps = []
    records, stats = collect_ranking(pol, ret, agent, OracleJudge(ret, K), [solvable, hopeless], cfg, episodes=eps)

    # one batched policy call per engine step, over all live states, N candidates at T = 1.0
    assert stats["engine_steps"] == 3 == len(pol.calls) == stats["judge_calls"]
    assert [len(c["prompts"]) for c in pol.calls] == [2, 2, 2]
    assert all(c["n"] == 4 and c["temperature"] == 1.0 for c in pol.calls)

    # only the solvable trajectory passes F1 > 0.75; the hopeless one's 3 states are counted, not returned
    assert {r.qid for r in records} == {solvable["id"]} and [r.step for r in records] == [0, 1, 2]
    assert stats["trajectories_kept"] == 1 and stats["trajectories_dropped"] == 1
    assert stats["states"] == 6 and stats["records_kept"] == 3 and stats["records_dropped"] == 3
    by_qid = {e.qid: e for e in eps}
    assert by_qid[solvable["id"]].metadata["kept"] and not by_qid[hopeless["id"]].metadata["kept"]

    hops = solvable["metadata"]["gold_chain"]
    expected = [f"search: {_good(hops[0])}", f"search: {_good(hops[1])}", f"answer: {solvable['golden_answers'][0]}"]
    ep = by_qid[solvable["id"]]
    for rec, want in zip(records, expected):
        assert rec.source == "rank:oracle" and rec.metadata["gold_chain"] == hops
        best = next(c for c in rec.candidates if c.rank == 0)
        assert best.raw == want and ep.steps[rec.step].action == best.action  # the executed action is rank 0
        assert [c.score for c in rec.candidates] == [0.5, 1 / 3, 1.0, 0.25]  # 1/(1+rank), ties by order
        assert rec.prompt == ep.steps[rec.step].prompt == pol.calls[rec.step]["prompts"][0]
        assert len(rec.history) == rec.step
    assert ep.answer == solvable["golden_answers"][0] and ep.reward == 1.0

    pairs = ranking_pairs(records)
    score = {(r.step, c.raw): c.score for r in records for c in r.candidates}
    assert len(pairs) == 6  # rank 0 (1.0) over ranks 2 and 3 (1/3, 1/4) at each state; rank 1 (0.5) in none
    assert all(score[(p.step, p.chosen)] > 0.75 and score[(p.step, p.rejected)] < 0.5 for p in pairs)
    assert all(p.prompt == records[p.step].prompt and p.source == "rank:oracle" for p in pairs)

    back = read_records(write_records(tmp_path / "rank.jsonl", records))
    assert [r.to_json() for r in back] == [r.to_json() for r in records]


def test_ranking_collection_through_the_continuous_pool_equals_lockstep(world):
    """RankingConfig(continuous=True): every state's N candidates run through the policy's slot pool (turns ending
    out of order, the judge called on the states whose candidates finished together) and give the lock-step
    collection's records, episodes and kept trajectories."""
    solvable, hopeless, ret = world
    agent = get_agent("react", mode="plain")
    cfg = RankingConfig(n_candidates=4, max_steps=3, k=K)
    lock_eps, cont_eps = [], []
    lock, lock_st = collect_ranking(ScriptedPolicy(_script(solvable, hopeless)), ret, agent, OracleJudge(ret, K),
                                    [solvable, hopeless], cfg, episodes=lock_eps)
    pol = SlotScripted(_script(solvable, hopeless))
    cont, cont_st = collect_ranking(pol, ret, agent, OracleJudge(ret, K), [solvable, hopeless],
                                    RankingConfig(n_candidates=4, max_steps=3, k=K, continuous=True), episodes=cont_eps)
    assert not pol.calls and pol.session.most == 8 and not pol.session.busy   # all through the pool: 2 states x 4
    view = lambda recs: [(r.qid, r.step, r.prompt, [(c.raw, c.score, c.rank) for c in r.candidates]) for r in recs]
    assert view(cont) == view(lock) and len(cont) == 3
    assert [(e.qid, e.answer, e.reward, e.metadata["kept"]) for e in cont_eps] == \
        [(e.qid, e.answer, e.reward, e.metadata["kept"]) for e in lock_eps]
    for key in ("states", "records_kept", "trajectories_kept", "invalid_candidates"):
        assert cont_st[key] == lock_st[key]


class _BrokenJudge:
    name = "broken"

    def judge(self, requests):
        return [JudgeResult(None, failure="HTTP 500", attempts=3, reply="oops") for _ in requests]


def test_judge_failures_are_recorded_not_dropped(world):
    solvable, hopeless, ret = world
    pol = ScriptedPolicy(_script(solvable, hopeless))
    records, stats = collect_ranking(pol, ret, get_agent("react", mode="plain"), _BrokenJudge(), [solvable],
                                     RankingConfig(n_candidates=4, max_steps=2, k=K, outcome_threshold=-1.0))
    assert stats["judge_failures"] == 2 and len(records) == 2
    assert all(c.score is None and c.failure == "HTTP 500" for r in records for c in r.candidates)
    assert records[0].metadata["judge_reply"] == "oops"
    assert ranking_pairs(records) == []


def test_ranking_config_errors():
    with pytest.raises(ValueError, match="RankingConfig.n_candidates=0"):
        RankingConfig(n_candidates=0)
    with pytest.raises(ValueError, match="outcome_metric"):
        RankingConfig(outcome_metric="bleu")


# ---------------------------------------------------------------------------------------------- rollout values
def _cand(kind, text, raw):
    return ScoredCandidate(raw, Action(kind, text, raw) if kind != "invalid" else Action.invalid(raw, "bad"))


def test_rollout_values_exact_means():
    ret = OverlapRetriever([Passage("p1", "France", "Paris is the capital of France."),
                            Passage("p2", "Paris", "Paris is a city in France.")])
    agent = get_agent("react", mode="plain")
    counters = {}

    def respond(prompt, j):
        key = prompt.splitlines()[0]
        i = counters.get((key, prompt.count("\nsearch: ")), 0)
        counters[(key, prompt.count("\nsearch: "))] = i + 1
        if key == "question: What is the capital of France?":
            return ["answer: Paris", "answer: Lyon", "answer: Paris", "answer: Paris"][i % 4]
        return "search: paris city" if prompt.count("\nsearch: ") == 1 else "answer: France"

    pol = ScriptedPolicy(respond)
    hist = [Step(Action("query", "a"), docs=[Doc("p1")]), Step(Action("query", "b"), docs=[Doc("p2")])]
    recs = [
        ProcessRecord("q1", "What is the capital of France?", ["Paris"], "react", [], "question: What is the capital "
                      "of France?\n", [_cand("answer", "Paris", "answer: Paris"), _cand("answer", "Lyon", "answer: Lyon"),
                                       _cand("query", "capital of France", "search: capital of France"),
                                       _cand("invalid", "", "??")], "rank:oracle"),
        ProcessRecord("q2", "Where is Paris?", ["France"], "react", [], "question: Where is Paris?\n",
                      [_cand("query", "paris", "search: paris")], "rank:oracle"),
        ProcessRecord("q3", "What is the capital of France?", ["Paris"], "react", hist, "", [
            _cand("query", "more", "search: more"), _cand("answer", "paris", "answer: paris")], "rank:oracle", step=2),
    ]
    st = {}
    out = rollout_values(pol, ret, agent, recs, RolloutValueConfig(m=4, temperature=0.7, metric="em", max_steps=3,
                                                                   k=1), stats=st)
    assert [[c.score for c in r.candidates] for r in out] == [[1.0, 0.0, 0.75, 0.0], [1.0], [0.0, 1.0]]
    assert out[0].candidates[2].extra["outcomes"] == [1.0, 0.0, 1.0, 1.0]
    assert out[0].candidates[0].extra["terminal"] and "terminal" not in out[0].candidates[2].extra
    assert all(r.source == "rollout" for r in out) and out[2].step == 2 and recs[0].candidates[0].score is None
    # every continuation of every candidate in one engine: 8 live episodes in the first call, then q2's 4
    assert [len(c["prompts"]) for c in pol.calls] == [8, 4] and all(c["temperature"] == 0.7 for c in pol.calls)
    assert st["continuations"] == 8 and st["terminal_candidates"] == 5
    # the candidate query was executed before continuing: its docs are in the continuation prompt
    assert "doc: France: Paris is the capital of France." in pol.calls[0]["prompts"][0]


def test_rollout_values_through_the_continuous_pool_equal_lockstep():
    """RolloutValueConfig(continuous=True): every continuation runs through the policy's slot pool (turns ending out
    of order) and gives the lock-step engine's values."""
    ret = OverlapRetriever([Passage(f"p{i}", f"T{i}", f"fact {i} about topic{i % 3}") for i in range(6)])
    agent = get_agent("react", mode="plain")

    def respond(prompt, j):   # a pure function of the prompt: the same script on either path
        q, n = prompt.splitlines()[0], prompt.count("\nsearch: ")
        return f"search: topic{len(q) % 3} fact {n}" if n < len(q) % 3 + 1 else f"answer: a{len(q) % 2}"

    recs = [ProcessRecord(f"q{i}", "q" * (i + 1) + "?", [f"a{i % 2}"], "react", [], "", [
        _cand("query", f"topic{i % 3}", f"search: topic{i % 3}"), _cand("answer", "a0", "answer: a0"),
        _cand("query", "fact 2", "search: fact 2")], "rank:oracle") for i in range(5)]
    cfg = dict(m=3, metric="em", max_steps=4, k=1, batch_size=4)
    lock = rollout_values(ScriptedPolicy(respond), ret, agent, recs, RolloutValueConfig(**cfg))
    pol, st = SlotScripted(respond), {}
    cont = rollout_values(pol, ret, agent, recs, RolloutValueConfig(**cfg, continuous=True), stats=st)
    view = lambda out: [[(c.score, c.extra["outcomes"]) for c in r.candidates] for r in out]
    assert view(cont) == view(lock)
    assert {v for r in view(lock) for c in r for v in c[1]} == {0.0, 1.0}   # both outcomes occur
    assert not pol.calls and pol.session.most == 4 and not pol.session.busy and "idle_slot_share" in st


def test_oracle_rescoring_and_agreement_on_collected_states(world):
    """The same states under a second source (judge_records) and the agreement table over them."""
    from jaxrag.supervision.agreement import agreement_table
    from jaxrag.supervision.judges import judge_records

    solvable, hopeless, ret = world
    pol = ScriptedPolicy(_script(solvable, hopeless))
    records, _ = collect_ranking(pol, ret, get_agent("react", mode="plain"), OracleJudge(ret, K), [solvable],
                                 RankingConfig(n_candidates=4, max_steps=3, k=K))
    oracle = judge_records(OracleJudge(ret, K), records, "step_score", source="oracle")
    assert [[c.score for c in r.candidates] for r in oracle] == [[0.0, 0.0, 1.0, 0.0]] * 3
    assert all(r.source == "oracle" and r.prompt == p.prompt for r, p in zip(oracle, records))
    [row] = agreement_table({"oracle": oracle, "rank:oracle": records})
    assert (row["agreement"], row["pairs"], row["states"]) == (1.0, 9, 3)  # 3 states x (1 good vs 3 bad)


def test_step_score_kind_keeps_the_oracles_ties(world):
    solvable, hopeless, ret = world
    pol = ScriptedPolicy(_script(solvable, hopeless))
    records, _ = collect_ranking(pol, ret, get_agent("react", mode="plain"), OracleJudge(ret, K), [solvable],
                                 RankingConfig(n_candidates=4, max_steps=3, k=K, judge_kind="step_score"))
    assert [[c.score for c in r.candidates] for r in records] == [[0.0, 0.0, 1.0, 0.0]] * 3
    assert all(r.source == "step_score:oracle" and r.candidates[2].rank == 0 for r in records)
    assert len(ranking_pairs(records)) == 9  # the good candidate over each of the 3 bad ones, at 3 states
    with pytest.raises(ValueError, match="judge_kind"):
        RankingConfig(judge_kind="refine")
