"""Judge prompts (the papers' text), reply parsers, the HTTP judge against a loopback server, the local judge
through a scripted policy, and the synthetic world's oracle on hand-checked cases."""
import http.server
import json
import re
import time
from pathlib import Path

import pytest

from fakes import OverlapRetriever, Passage, ScriptedPolicy, completion, loopback
from jaxrag.data.synthetic.questions import generate_questions
from jaxrag.data.synthetic.teacher import QUERY_TEMPLATES
from jaxrag.data.synthetic.world import generate_world
from jaxrag.env.mdp import Action, Doc, State, Step
from jaxrag.supervision import prompts as P
from jaxrag.supervision.judge_protocol import JudgeRequest
from jaxrag.supervision.judges import HttpJudge, LocalJudge, OracleJudge, get_judge, ranks_from_scores

FIGURES = Path(__file__).parent / "data" / "paper_prompts"   # the papers' prompt figures, quoted (README there)


def _norm(text: str) -> str:
    """Compare text across PDF/HTML extraction: quotes, markdown marks and whitespace dropped."""
    text = text.replace("¡", "<").replace("¿", ">")
    text = re.sub(r"[\"'“”‘’`*#]", "", text)
    return " ".join(text.split())


def _figure(name: str) -> str:
    return (FIGURES / name).read_text(encoding="utf-8").strip()


# ------------------------------------------------------------------------------------------------ prompts
def test_rank_prompt_is_the_paper_figure_10():
    fig = _figure("rag_gym_rank.txt")
    msgs = P.rank_messages("{question}", [], [], P.PromptOptions())
    rendered = msgs[0]["content"] + " " + P.RANK_USER.format(question="{question}", curr_history="{curr_history}",
                                                             actions_text="{actions_text}")
    assert _norm(rendered) == _norm(fig)


def test_step_score_and_smartsearch_prompts_are_the_papers():
    fig14 = _figure("reasonrag_step_score.txt")
    assert _norm(P.STEP_SCORE_SYSTEM["paper"]) == _norm(fig14)
    scoring = _figure("smartsearch_query_score.txt")
    assert _norm(P.USEFULNESS_USER["paper"]) == _norm(scoring)
    refining = _figure("smartsearch_query_refine.txt")
    assert _norm(P.REFINE_USER["paper"]) == _norm(refining)


def test_rank_prompt_rendering():
    hist = [Step(Action("query", "who directed Foo"), docs=[Doc("d1", 1.0, "Foo", "Foo was directed by Bar.")])]
    cands = [Action("query", "Bar birthplace"), Action("answer", "Paris")]
    msgs = P.rank_messages("Where was the director of Foo born?", hist, cands)
    assert msgs[0] == {"role": "system", "content": P.RANK_SYSTEM}
    user = msgs[1]["content"]
    assert user.startswith("## Original Question:\nWhere was the director of Foo born?\n\n## Information-Seeking History:\n")
    assert "[0] Query: Bar birthplace\n[1] Answer: Paris\n\n### Important Assumption" in user
    hist_json = json.loads(user.split("## Information-Seeking History:\n")[1].split("\n\n## Proposed")[0])
    assert hist_json == [{"query": "who directed Foo", "documents": [
        {"id": "d1", "title": "Foo", "content": "Foo was directed by Bar."}]}]
    assert '```json{"ranked_indices": [list of indices]}```' in user
    hist[0].summary = "Bar"  # summarizing designs show the summary as the answer (code: qa_cache)
    assert '"answer": "Bar"' in P.rank_messages("q", hist, cands)[1]["content"]


def test_step_score_prompt_variants_and_user_message():
    hist = [Step(Action("query", "Foo director", raw="So the next query is <query>Foo director</query>"),
                 summary="Bar", summary_raw="Based on the query, the relevant evidence is <evidence>Bar</evidence>")]
    cand = Action("answer", "Paris", raw="So the answer is <answer>Paris</answer>")
    msgs = P.step_score_messages("Q?", ["Paris", "City of Light"], hist, Step(cand))
    assert "between [0, 1]" in msgs[0]["content"]
    assert msgs[1]["content"] == ("Question: Q?\nGolden Answer: Paris or City of Light\nAgent Reasoning Process: "
                                  "So the next query is <query>Foo director</query> Based on the query, the relevant "
                                  "evidence is <evidence>Bar</evidence> So the answer is <answer>Paris</answer>")
    code = P.step_score_messages("Q?", ["Paris"], hist, Step(cand), P.PromptOptions(step_score_variant="code"))
    assert "between [0, 100]" in code[0]["content"]
    with pytest.raises(ValueError, match="step_score_variant"):
        P.PromptOptions(step_score_variant="mine")


def test_usefulness_and_refine_prompts_show_the_search_process():
    hist = [Step(Action("query", "q1"), docs=[Doc("a", 0, "A", "alpha")])]
    msgs = P.usefulness_messages("Q?", ["Gold"], hist, Step(Action("query", "q2"), docs=[Doc("b", 0, "B", "beta")]))
    text = msgs[0]["content"]
    assert ("### Agent’s search process up to the current search round\n<search> q1 </search>\n<result>\n\"A\" alpha\n"
            "</result>\n<search> q2 </search>\n<result>\n\"B\" beta\n</result>\n") in text
    assert "### Golden answer\nGold\n" in text
    code = P.usefulness_messages("Q?", ["Gold"], hist, Step(Action("query", "q2")), P.PromptOptions(smartsearch_variant="code"))
    assert "necessary and actionable" in code[0]["content"]
    ref = P.refine_messages("Q?", hist, Step(Action("query", "q2")), "too vague." + P.REDUNDANT_EXPLANATION)
    assert "### Issues of the query\ntoo vague. The agent's query of the current search round is redundant" in ref[0]["content"]


# ------------------------------------------------------------------------------------------------ parsers
def test_parse_rank():
    p = P.parse_rank('Here: ```json{"ranked_indices": [2, 0, 1]}```', 3)
    assert p.ok and p.ranks == [1, 2, 0] and p.scores == [0.5, 1 / 3, 1.0]
    # strict (RAG-Gym's reading, the default): no fence -> a failure (the released code scores every action 0)
    assert "no ```json" in P.parse_rank('{"ranked_indices": [1, 0]}', 2).failure
    assert P.parse_rank('{"ranked_indices": [1, 0]}', 2, "lenient").ranks == [1, 0]  # lenient: the JSON object
    for reply, why in [("I prefer action 2", "no {\"ranked_indices\""),
                       ('```json{"ranked_indices": [0, 0, 1]}```', "repeats"),
                       ('```json{"ranked_indices": [0, 3, 1]}```', "out of range 0..2: [3]"),
                       ('```json{"ranked_indices": [0, 1]}```', "misses [2]"),
                       ('```json{"ranked_indices": "0,1,2"}```', "not a list"),
                       ('```json{"ranked_indices": [0, 1.5, 2]}```', "non-integers")]:
        r = P.parse_rank(reply, 3, "lenient")
        assert not r.ok and why in r.failure and r.scores is None, (reply, r.failure)
    assert "ValueError" in P.parse_rank('```json{"ranked_indices": [0, 1]}```', 3).failure  # action 2 missing
    with pytest.raises(ValueError, match="mode"):
        P.parse_rank("", 1, "loose")
    with pytest.raises(ValueError, match="rank_parse"):
        P.PromptOptions(rank_parse="loose")


def test_parse_step_score_usefulness_refine():
    assert P.parse_step_score("Flawed. So the score is 0.4.").scores == [0.4]
    assert P.parse_step_score("So the score is [85]", "code").scores == [0.85]
    assert P.parse_step_score("step 2 wrong ... 0.3").scores == [0.3]  # the code reads the last number
    assert "out of range [0, 1]" in P.parse_step_score("So the score is 7").failure
    assert "out of range [0, 100]" in P.parse_step_score("So the score is 150", "code").failure
    assert P.parse_step_score("harsh!").failure == "no score in the reply"
    u = P.parse_usefulness("<answer> 1 </answer>\n<explanation> finds the birthplace </explanation>")
    assert u.scores == [1.0] and u.rationale == "finds the birthplace"
    assert "out of range" in P.parse_usefulness("<answer>2</answer>").failure
    assert "not a number" in P.parse_usefulness("<answer>yes</answer>").failure
    assert "no <answer>" in P.parse_usefulness("score: 1").failure
    assert P.parse_refine("<search> Bar birthplace </search><explanation>x</explanation>").text == "Bar birthplace"
    assert P.parse_refine("<search> Bar birthplace").text == "Bar birthplace"  # cut at the stop string
    assert "no <search>" in P.parse_refine("just search for Bar").failure


# ------------------------------------------------------------------------------------------- HTTP judge
def _chat(content: str) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()


class _Handler(http.server.BaseHTTPRequestHandler):
    replies: list = []  # (status, body bytes | str content, headers dict, delay seconds)
    seen: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        status, payload, headers, delay = type(self).replies.pop(0) if type(self).replies else (200, "", {}, 0)
        if delay:
            time.sleep(delay)
        data = payload if isinstance(payload, bytes) else _chat(payload)
        try:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up (timeout test)
            pass

    def log_message(self, *a):
        pass


@pytest.fixture()
def server():
    _Handler.replies, _Handler.seen = [], []
    with loopback(_Handler) as url:
        yield url


def _rank_request(n=3):
    cands = [Action("query", f"q{i}") for i in range(n - 1)] + [Action("answer", "Paris")]
    return JudgeRequest("rank", State("Where?"), cands, ["Paris"])


def _http(url, sleeps, **kw):
    return HttpJudge(url, "judge-model", max_retries=2, backoff_s=0.25, sleep=sleeps.append, **kw)


def test_http_good_reply(server):
    sleeps = []
    _Handler.replies = [(200, 'ranking: ```json{"ranked_indices": [2, 0, 1]}```', {}, 0)]
    [res] = _http(server, sleeps).judge([_rank_request()])
    assert res.ok and res.ranks == [1, 2, 0] and res.scores == [0.5, 1 / 3, 1.0]
    assert res.attempts == 1 and res.failure == "" and sleeps == []
    body = _Handler.seen[0]
    assert body["model"] == "judge-model" and body["messages"][0]["content"] == P.RANK_SYSTEM
    assert "[0] Query: q0\n[1] Query: q1\n[2] Answer: Paris" in body["messages"][1]["content"]


def test_http_malformed_reply_is_retried_then_recorded(server):
    sleeps = []
    _Handler.replies = [(200, "action 2 is best", {}, 0), (200, '```json{"ranked_indices": [1, 0, 2]}```', {}, 0)]
    [res] = _http(server, sleeps).judge([_rank_request()])
    assert res.ok and res.attempts == 2 and res.ranks == [1, 0, 2] and sleeps == [0.25]
    _Handler.replies = [(200, "no idea", {}, 0)] * 3
    [res] = _http(server, sleeps := []).judge([_rank_request()])
    assert not res.ok and res.scores is None and res.attempts == 3
    assert "unparseable reply" in res.failure and "ranked_indices" in res.failure
    assert res.reply == "no idea" and sleeps == [0.25, 0.5]
    _Handler.replies = [(200, b"{not json", {}, 0)] * 3
    [res] = _http(server, []).judge([_rank_request()])
    assert "malformed reply" in res.failure and res.reply == "{not json" and res.attempts == 3


def test_http_500_and_429_retry_after(server):
    _Handler.replies = [(500, b"oops", {}, 0)] * 3
    [res] = _http(server, sleeps := []).judge([_rank_request()])
    assert not res.ok and res.failure.endswith("HTTP 500") and res.attempts == 3 and res.reply == "oops"
    _Handler.replies = [(429, b"slow down", {"Retry-After": "7"}, 0),
                        (503, b"busy", {"Retry-After": "2.5"}, 0),
                        (200, '```json{"ranked_indices": [0, 1, 2]}```', {}, 0)]
    [res] = _http(server, sleeps := []).judge([_rank_request()])
    assert res.ok and res.attempts == 3 and sleeps == [7.0, 2.5]  # Retry-After honoured, not the backoff
    _Handler.replies = [(429, b"", {"Retry-After": "1000"}, 0)] * 3
    [res] = _http(server, sleeps := [], max_wait_s=30.0).judge([_rank_request()])
    assert sleeps == [30.0, 30.0] and "HTTP 429 (Retry-After 1000s)" in res.failure
    _Handler.replies = [(401, b"{}", {}, 0)]
    [res] = _http(server, sleeps := []).judge([_rank_request()])
    assert res.attempts == 1 and "HTTP 401" in res.failure  # not retried


def test_http_timeout_and_refused(server):
    _Handler.replies = [(200, "late", {}, 1.0)] * 2
    j = HttpJudge(server, "m", max_retries=1, timeout_s=0.2, backoff_s=0.0, sleep=lambda s: None)
    [res] = j.judge([_rank_request()])
    assert not res.ok and "timeout after 0.2s" in res.failure and res.attempts == 2
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    j = HttpJudge(f"http://127.0.0.1:{port}/v1", "m", max_retries=1, sleep=lambda s: None)
    [res] = j.judge([_rank_request()])
    assert not res.ok and "connection refused" in res.failure and res.attempts == 2


def test_http_per_candidate_calls_and_invalid_candidates(server):
    _Handler.replies = [(200, "<answer> 1 </answer><explanation>finds it</explanation>", {}, 0),
                        (200, "<answer> 0 </answer><explanation>vague</explanation>", {}, 0)]
    cands = [Action("query", "q0"), Action.invalid("??", "bad"), Action("query", "q2")]
    req = JudgeRequest("usefulness", State("Q?"), cands, ["G"], {"candidate_docs": [[], [], []]})
    [res] = HttpJudge(server, "m", max_workers=1, sleep=lambda s: None).judge([req])
    assert res.ok and res.scores == [1.0, 0.0, 0.0] and len(_Handler.seen) == 2  # the invalid one is not sent
    assert res.rationale.splitlines() == ["[0] finds it", "[1] invalid action", "[2] vague"]
    [res] = HttpJudge(server, "m").judge([JudgeRequest("usefulness", State("Q?"), cands[:1], ["G"])])
    assert not res.ok and "candidate_docs" in res.failure and res.attempts == 0


# ------------------------------------------------------------------------------------------ local judge
def test_local_judge_batches_and_retries():
    replies = {}

    def respond(prompt, j):
        seen = replies.setdefault(prompt, 0)
        replies[prompt] += 1
        return "hmm" if ("q1" in prompt and seen == 0) else "So the score is 0.25"

    pol = ScriptedPolicy(respond)
    reqs = [JudgeRequest("step_score", State("Q?"), [Action("query", "q0"), Action("query", "q1")], ["G"]),
            JudgeRequest("step_score", State("R?"), [Action("answer", "x"), Action.invalid("", "e")], ["G"])]
    judge = LocalJudge(pol, max_retries=1, retry_temperature=0.5)
    res = judge.judge(reqs)
    assert [r.scores for r in res] == [[0.25, 0.25], [0.25, 0.0]] and res[0].attempts == 2 and res[1].attempts == 1
    assert [len(c["prompts"]) for c in pol.calls] == [3, 1]  # every call in one batch, then only the failed one
    assert [c["temperature"] for c in pol.calls] == [0.0, 0.5]
    bad = LocalJudge(ScriptedPolicy(lambda p, j: "no number here"), max_retries=2)
    [r] = bad.judge(reqs[:1])
    assert not r.ok and r.attempts == 3 and "no score in the reply" in r.failure and r.reply.startswith("no number")


# ----------------------------------------------------------------------------------------- oracle judge
@pytest.fixture(scope="module")
def world():
    w = generate_world(0, n_countries=3, n_cities=6, n_persons=20, n_films=10, n_companies=6)
    qs = generate_questions(w)
    return w, qs, OverlapRetriever([Passage(p.id, p.title, p.contents) for p in w.passages])


def _good(hop):
    return QUERY_TEMPLATES[hop["relation"]][0].format(e=hop["entity"])


def test_oracle_hand_checked(world):
    w, qs, ret = world
    k = 3
    def found(h):
        return {d.doc_id for d in ret.search([_good(h)], k)[0]}

    # a 2-hop question whose first-template queries find their own gold passage at k, and the hop-1 query not
    # the hop-2 passage (checked here, not assumed)
    q = next(q for q in qs if q["metadata"]["type"] == "2hop"
             and all(h["passage_id"] in found(h) for h in q["metadata"]["gold_chain"])
             and q["metadata"]["gold_chain"][1]["passage_id"] not in found(q["metadata"]["gold_chain"][0]))
    h1, h2 = q["metadata"]["gold_chain"]
    meta = q["metadata"]
    judge = OracleJudge(ret, k)
    s0 = State(q["question"], qid=q["id"])
    cands = [Action("query", _good(h1)), Action("query", "zzzz qqqq"), Action("answer", q["golden_answers"][0]),
             Action("answer", h1["answer"]), Action.invalid("??", "bad")]
    [r] = judge.judge([JudgeRequest("step_score", s0, cands, q["golden_answers"], meta)])
    # good next-hop query 1; a query that retrieves nothing 0; a correct (lucky) answer 1; the bridge entity
    # as a premature answer 0; invalid 0
    assert r.scores == [1.0, 0.0, 1.0, 0.0, 0.0] and r.ranks == [0, 2, 1, 3, 4]
    assert "premature: hop 1, 2 unresolved" in r.rationale
    step1 = Step(Action("query", _good(h1)), docs=ret.search([_good(h1)], k)[0])
    s1 = State(q["question"], [step1], qid=q["id"])
    cands = [Action("query", _good(h1)), Action("query", _good(h2)), Action("query", _good(h1).upper() + " "),
             Action("answer", q["golden_answers"][0])]
    [r] = judge.judge([JudgeRequest("rank", s1, cands, q["golden_answers"], meta)])
    # the repeated query (also in another case/spacing) 0; the hop-2 query 1; the correct answer 1
    assert r.ranks == [2, 0, 3, 1] and r.scores == [1 / 3, 1.0, 1 / 4, 1 / 2]
    assert "[0] redundant: repeats an earlier query" in r.rationale
    # a new query that retrieves only documents already seen is redundant too
    seen_only = Action("query", "q")
    docs = [list(step1.docs)]
    [r] = judge.judge([JudgeRequest("usefulness", s1, [seen_only], [], {**meta, "candidate_docs": docs})])
    assert r.scores == [0.0] and "only already-seen" in r.rationale
    [r] = judge.judge([JudgeRequest("refine", s1, [Action("query", "zzzz")], [], meta)])
    assert r.texts == [_good(h2)]
    assert judge.search_calls == 2  # one batched search per judge call that needed one


def test_oracle_failures_and_registry(world):
    _, _, ret = world
    judge = get_judge("oracle", retriever=ret, k=2)
    [r] = judge.judge([JudgeRequest("rank", State("q"), [Action("query", "x")], [], {})])
    assert not r.ok and "gold_chain" in r.failure
    with pytest.raises(ValueError, match="unknown judge 'gpt'"):
        get_judge("gpt")
    assert ranks_from_scores([0.0, 1.0, 1.0, 0.5]) == [3, 0, 1, 2]


def test_local_judge_refine_and_short_policy_output():
    pol = ScriptedPolicy(lambda p, j: "<search> better query </search>\n<explanation>names the entity</explanation>")
    req = JudgeRequest("refine", State("Q?"), [Action("query", "vague one"), Action("answer", "x")], [],
                       {"explanations": ["too vague", None]})
    [r] = LocalJudge(pol).judge([req])
    assert r.ok and r.texts == ["better query", ""] and r.scores == [1.0, 0.0]
    assert len(pol.calls[0]["prompts"]) == 1 and "### Issues of the query\ntoo vague\n" in pol.calls[0]["prompts"][0]

    class Short:  # one completion list for two prompts
        def generate(self, prompts, **kw):
            return [[completion("So the score is 1")]]

    reqs = [JudgeRequest("step_score", State("Q?"), [Action("query", "a"), Action("query", "b")], ["G"])]
    [r] = LocalJudge(Short(), max_retries=3).judge(reqs)
    assert not r.ok and "policy returned 1 completion lists for 2 prompts" in r.failure and r.attempts == 1


def test_invalid_candidates_rank_last_and_score_zero(world):
    pol = ScriptedPolicy(lambda p, j: '```json{"ranked_indices": [1, 0]}```')
    cands = [Action.invalid("??", "bad"), Action("query", "q1"), Action("query", "q2")]
    [r] = LocalJudge(pol).judge([JudgeRequest("rank", State("Q?"), cands, ["G"])])
    assert r.ranks == [2, 1, 0] and r.scores == [0.0, 0.5, 1.0]
    assert "[0] Query: q1\n[1] Query: q2\n\n" in pol.calls[0]["prompts"][0]  # the invalid one is not shown
    _, qs, ret = world
    q = qs[0]
    oracle_cands = [Action.invalid("??", "bad"), Action("query", "zzzz"), Action("answer", "nobody at all")]
    [r] = OracleJudge(ret, 2).judge([JudgeRequest("rank", State(q["question"]), oracle_cands, q["golden_answers"],
                                                  q["metadata"])])
    assert r.ranks == [2, 0, 1] and r.scores == [0.0, 1.0, 0.5]  # all useless: still a rank 0, never the invalid


def test_executed_step_convention_smartsearch_assess_and_mcts():
    """supervision.smartsearch / supervision.mcts put the judged step LAST in state.history, with its documents."""
    from jaxrag.env.mdp import Episode
    from jaxrag.supervision.smartsearch import assess

    ep = Episode("q", "Where?", ["Gold"], steps=[
        Step(Action("query", "q1"), docs=[Doc("a", 0, "A", "alpha")]),
        Step(Action("query", "q2"), docs=[Doc("b", 0, "B", "beta")]),
        Step(Action("answer", "Gold"))])
    pol = ScriptedPolicy(lambda p, j: "<answer> 0 </answer><explanation>misses it</explanation>" if "q2" in p
                         else "<answer> 1 </answer><explanation>finds it</explanation>")
    [credits] = assess([ep], LocalJudge(pol))
    assert [(c.useful, c.failure) for c in credits] == [(1, ""), (0, "")]
    first, second = pol.calls[0]["prompts"]
    assert "<search> q1 </search>\n<result>\n\"A\" alpha\n</result>\n\n### Evaluation" in first  # its round is last
    assert "q2" not in first
    assert second.count("<search> q2 </search>") == 1 and "\"B\" beta\n</result>\n\n### Evaluation" in second
    assert "misses it" in credits[1].explanation and "[0]" not in credits[1].explanation
    # refine of the executed step: its query is the current round, the issue text as given
    req = JudgeRequest("refine", ep.state(2), [ep.steps[1].action], explanation="misses it", metadata={"step": 1})
    rp = ScriptedPolicy(lambda p, j: "<search> better </search>")
    [r] = LocalJudge(rp).judge([req])
    assert r.texts == ["better"] and "### Issues of the query\nmisses it" in rp.calls[0]["prompts"][0]
    assert rp.calls[0]["prompts"][0].count("<search> q2 </search>") == 1
    # ReasonRAG node (mcts): the judged step with its evidence closes the reasoning process, once
    hist = [Step(Action("query", "q1", raw="So the next query is <query>q1</query>"), summary="alpha",
                 summary_raw="Based on the query, the relevant evidence is <evidence>alpha</evidence>")]
    req = JudgeRequest("step_score", State("Where?", hist), [hist[0].action], ["Gold"], {"in_history": True})
    sp = ScriptedPolicy(lambda p, j: "So the score is 0.5")
    [r] = LocalJudge(sp).judge([req])
    assert r.scores == [0.5] and sp.calls[0]["prompts"][0].endswith(
        "Agent Reasoning Process: So the next query is <query>q1</query> Based on the query, the relevant evidence "
        "is <evidence>alpha</evidence>\n\n")


def test_oracle_reads_the_executed_step_convention(world):
    w, qs, ret = world
    q = next(q for q in qs if q["metadata"]["type"] == "1hop")
    [h] = q["metadata"]["gold_chain"]
    gold_doc = Doc(h["passage_id"], 0, h["title"], w.passage(h["passage_id"]).contents)
    hist = [Step(Action("query", "anything at all"), docs=[gold_doc])]
    req = JudgeRequest("usefulness", State(q["question"], hist), [hist[0].action], q["golden_answers"],
                       {**q["metadata"], "step": 0})
    judge = OracleJudge(ret, 2)
    [r] = judge.judge([req])
    assert r.scores == [1.0] and r.rationale == "finds the gold passage of hop 1" and judge.search_calls == 0
