"""LLM judge against a fake OpenAI-compatible server on loopback, including malformed replies."""
import http.server
import json

import pytest

from fakes import loopback

from jaxrag.judge import JudgeError, OpenAIJudge, judge_from_config, parse_yes_no


class _Handler(http.server.BaseHTTPRequestHandler):
    replies: list = []
    seen: list = []
    answer = None   # optional: prompt -> reply text (for concurrent requests, whose order is not fixed)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, self.headers.get("Authorization"), body))
        if type(self).answer is not None:
            status, payload = 200, type(self).answer(body["messages"][0]["content"])
        else:
            status, payload = type(self).replies.pop(0) if type(self).replies else (200, "yes")
        data = payload if isinstance(payload, bytes) else json.dumps(
            {"choices": [{"message": {"role": "assistant", "content": payload}}]}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture()
def server():
    _Handler.replies, _Handler.seen, _Handler.answer = [], [], None
    with loopback(_Handler) as url:
        yield url


def test_yes_no_and_request_shape(server, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "sekrit")
    j = OpenAIJudge(server, "gpt-4o", api_key_env="JUDGE_KEY", backoff_s=0.0)
    _Handler.replies = [(200, "Yes."), (200, "no")]
    assert j.judge_answer(["Paris"], "It is Paris") is True
    assert j.judge_answer(["Paris"], "Lyon") is False
    path, auth, body = _Handler.seen[0]
    assert path == "/v1/chat/completions" and auth == "Bearer sekrit"
    assert body["model"] == "gpt-4o" and body["temperature"] == 0.0
    assert body["messages"][0]["content"] == LJ_RELEASED.format("['Paris']", "It is Paris")


# ARENA's released src/gpt_eval.py format_prompt, written out: gold answers as str(list), four newlines between parts
LJ_RELEASED = ("*************Consider a knowledge Q&A RAG task to test the capability of a testing model, the correct "
               "answer list is:*************\n{}\n\n\n\n*************Here is the model's response:*************\n{}\n\n\n\n"
               "*************Please check if the model's answer is correct. As long as the model's answer hits any "
               "item (or synonym) in the correct answer list, it can be considered correct. You only need to answer "
               "\"yes\" or \"no\".*************")


def test_blank_answer_is_false_without_a_call(server):
    """The released scorer gives an empty <answer> 0 without asking GPT-4o."""
    j = OpenAIJudge(server, "m", backoff_s=0.0)
    assert j.judge_answer(["a"], "  ") is False and j.judge_answer(["a"], None) is False
    assert _Handler.seen == []


def test_judge_answers_concurrent_in_order(server):
    """judge_answers sends `workers` requests at a time and returns each verdict at its item's place."""
    _Handler.answer = lambda prompt: "yes" if "right" in prompt else "no"
    j = OpenAIJudge(server, "m", backoff_s=0.0, workers=4)
    items = [(["x"], "right" if i % 3 == 0 else "wrong") for i in range(20)] + [(["x"], None)]
    got = [v for v, _ in j.judge_answers(items)]
    assert got == [i % 3 == 0 for i in range(20)] + [False]
    assert len(_Handler.seen) == 20


def test_retries_then_succeeds_on_malformed_and_5xx(server):
    j = OpenAIJudge(server, "m", retries=4, backoff_s=0.0)
    _Handler.replies = [(200, b"{not json"), (500, b"oops"), (200, b'{"choices": []}'), (200, "yes")]
    assert j.judge_answer(["a"], "a") is True
    assert len(_Handler.seen) == 4


def test_gives_up_with_a_clear_error(server):
    j = OpenAIJudge(server, "m", retries=2, backoff_s=0.0)
    _Handler.replies = [(200, b"garbage"), (200, b"garbage")]
    with pytest.raises(JudgeError, match="malformed reply"):
        j.chat([{"role": "user", "content": "x"}])
    _Handler.replies = [(401, b"{}")]
    with pytest.raises(JudgeError, match="HTTP 401"):
        j.chat([{"role": "user", "content": "x"}])
    _Handler.replies = [(200, b"garbage"), (200, b"garbage")]
    assert j.judge_answer(["a"], "a") is None           # unreachable verdict: None, not a crash


def test_unreachable_and_timeout():
    j = OpenAIJudge("http://127.0.0.1:9/v1", "m", retries=1, timeout_s=0.5)
    assert j.judge_answer(["a"], "a") is None
    assert j.judge_answer(["a"], None) is False


def test_parse_yes_no_and_config():
    assert parse_yes_no("**Yes**, it matches") is True and parse_yes_no("No.") is False
    assert parse_yes_no("maybe") is None and parse_yes_no("") is None
    assert judge_from_config({"base_url": ""}) is None
    assert judge_from_config({"base_url": "http://x/v1", "model": "m", "retries": 5}).retries == 5
    assert judge_from_config({"base_url": "http://x/v1", "model": "m", "workers": 2}).workers == 2
    with pytest.raises(ValueError, match=r"unknown keys \['retires'\]"):  # even with no endpoint set
        judge_from_config({"base_url": "", "retires": 5})


def test_lj_counts_and_records_every_failure_by_kind(server):
    """LJ over episodes: 'Maybe' is retried then recorded as unparseable, HTTP errors keep their status, each
    episode carries its own record, and the table says how many answers were judged."""
    from jaxrag.env.mdp import Episode
    from jaxrag.evaluate import episode_metrics, results_table

    j = OpenAIJudge(server, "m", retries=2, backoff_s=0.0, workers=1)  # one at a time: the replies below are in order
    eps = [Episode(qid=str(i), question="q", gold=["a"], answer=a) for i, a in enumerate(["a", "a", "b", "a", None])]
    _Handler.replies = [(200, "yes"),                      # 0: judged yes
                        (200, "Maybe"), (200, "Maybe?"),   # 1: neither yes nor no, twice: a recorded failure
                        (200, "no"),                       # 2: judged no
                        (500, b"x"), (503, b"y")]          # 3: HTTP errors after 2 attempts
    m = episode_metrics(eps, judge=j)                      # 4: no answer: False, without a call
    assert (m["lj"], m["lj_judged"], m["lj_failed"]) == (1 / 3, 3, 2)
    assert m["lj_failures"] == {"unparseable reply": 1, "HTTP 503": 1}
    assert eps[1].metadata["lj"]["failure"].startswith("unparseable reply: neither yes nor no: 'Maybe?'")
    assert eps[1].metadata["lj"]["attempts"] == 2 and eps[3].metadata["lj"]["verdict"] is None
    assert eps[0].metadata["lj"]["verdict"] is True and eps[4].metadata["lj"] == {"verdict": False}
    md, csv_text = results_table({"ReAct": {"hotpotqa": m}})
    assert "| hotpotqa LJ | hotpotqa LJ judged/n |" in md and "| 33.33 | 3/5 |" in md
    assert "3/5" in csv_text
