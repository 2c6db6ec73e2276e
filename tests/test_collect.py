"""RAG-Gym collection on real data (jaxrag.pipelines.collect) through configs/rag_gym/dpo.py: the smoke variant runs
collect -> DPO -> eval end to end; the pairs' ids are exactly what the policy saw and sampled; an OpenAI-compatible
judge over HTTP (a loopback server) ranks the same states; judge failures are recorded, never silently dropped."""

import http.server
import importlib.util
import json
import re
from pathlib import Path

import pytest

from fakes import loopback

from jaxrag.main import StageError, plan, run
from jaxrag.pipelines.common import load_policy
from jaxrag.supervision.records import read_records

ROOT = Path(__file__).resolve().parents[1]


def load(variant: str = ""):
    spec = importlib.util.spec_from_file_location("cfg_rag_gym_dpo", ROOT / "configs" / "rag_gym" / "dpo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(variant)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    wd = tmp_path_factory.mktemp("rg_dpo") / "run"
    return run(load("smoke"), wd), wd


def test_smoke_runs_collect_dpo_eval(smoke):
    ran, wd = smoke
    assert ran == ["setup", "collect", "dpo", "eval"]
    stats = json.loads((wd / "collect" / "stats.json").read_text())
    records = read_records(wd / "collect" / "records.jsonl")
    assert stats["questions"] == 4 and stats["trajectories_kept"] == 4 and stats["states"] == len(records) > 0
    assert stats["judge"] == "shortest" and stats["judge_failures"] == 0 and stats["pairs"] > 0
    dpo = rows(wd / "collect" / "dpo.jsonl")
    assert len(dpo) == stats["pairs"] == len(rows(wd / "collect" / "pairs.jsonl"))
    assert len(rows(wd / "collect" / "sft.jsonl")) == len(records)          # the best candidate of every state
    # the ids are the prompt as the policy encoded it and the candidates' own sampled ids
    policy = load_policy({"path": str(wd / "setup" / "model"), "max_prompt_tokens": 384}, wd)
    rec = next(r for r in records if r.qid == dpo[0]["qid"] and r.step == dpo[0]["step"])
    assert dpo[0]["prompt_ids"] == policy.encode_prompt(rec.prompt, 16)
    assert dpo[0]["chosen_ids"] in [c.token_ids for c in rec.candidates]
    assert dpo[0]["rejected_ids"] in [c.token_ids for c in rec.candidates]
    assert dpo[0]["chosen_ids"] != dpo[0]["rejected_ids"]
    summary = json.loads((wd / "dpo" / "summary.json").read_text())
    assert summary["steps"] == 2 if "steps" in summary else True
    assert (wd / "dpo" / "model" / "config.json").is_file() and (wd / "dpo" / "model" / "tokenizer.json").is_file()
    m = rows(wd / "eval" / "metrics.jsonl")
    assert [(r["method"], r["dataset"], r["n"]) for r in m] == [("re2search+dpo", "HotpotQA", 2)]


class _Judge(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint that ranks the listed candidates in reverse order ("garbage": unparseable)."""
    mode = "reverse"
    calls = 0

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls += 1
        shown = [int(i) for i in re.findall(r"^\[(\d+)\]", body["messages"][-1]["content"], re.M)]
        text = (f'```json{{"ranked_indices": {shown[::-1]}}}```' if self.mode == "reverse" else "I like them all")
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture()
def judge_url():
    _Judge.calls = 0
    with loopback(_Judge) as url:
        yield url


def scripted_actor(pcfg=None, workdir=None):
    """Valid, distinct plain-ReAct actions: candidate j of a call searches "fact j", or answers on the second step."""
    from jaxrag.testing import ScriptedPolicy
    return ScriptedPolicy(lambda p, j: f"answer: guess {j}" if "\nsearch: " in p else f"search: fact {j}")


def http_collect(smoke, url):
    c = load("smoke")
    c.stages = ["collect"]
    c.collect.policy = {"fn": "test_collect:scripted_actor"}
    c.collect.agent = {"name": "react", "opts": {"mode": "plain"}}
    c.collect.judge = {"kind": "http", "base_url": url, "model": "judge-model", "api_key_env": "NO_SUCH_KEY",
                       "max_retries": 1, "timeout_s": 10.0, "max_workers": 2}
    return c


def test_http_judge_ranks_the_states(smoke, judge_url, tmp_path):
    _Judge.mode = "reverse"
    assert run(http_collect(smoke, judge_url), tmp_path / "http") == ["collect"]
    stats = json.loads((tmp_path / "http" / "collect" / "stats.json").read_text())
    records = read_records(tmp_path / "http" / "collect" / "records.jsonl")
    assert stats["judge"] == "judge-model" and stats["judge_failures"] == 0 and _Judge.calls > 0
    assert all(r.source == "rank:judge-model" for r in records)
    assert len(records) == 8 and all(len(r.candidates) == 3 for r in records)    # 4 questions x 2 steps
    for r in records:  # the judge ranked the candidates it was shown in reverse: the last is best
        assert [c.rank for c in r.candidates] == [2, 1, 0] and [c.score for c in r.candidates] == [1 / 3, 1 / 2, 1.0]
        assert r.history == [] or r.history[0].action.text == "fact 2"      # the best-ranked action was executed
    dpo = rows(tmp_path / "http" / "collect" / "dpo.jsonl")   # text rows: the scripted actor has no token ids
    # one pair per state: score 1 > 0.75 against 1/3 < 0.5 (1/2 is not below 0.5)
    assert len(dpo) == 8 and all(d["chosen"].endswith(" 2") and d["rejected"].endswith(" 0") for d in dpo)


def test_judge_failures_are_recorded_and_no_pairs_is_an_error(smoke, judge_url, tmp_path):
    _Judge.mode = "garbage"
    with pytest.raises(RuntimeError, match="no preference pairs from 4 questions"):
        run(http_collect(smoke, judge_url), tmp_path / "bad")
    assert not (tmp_path / "bad" / "collect" / "DONE").exists()
    stats = json.loads((tmp_path / "bad" / "collect" / "stats.json").read_text())
    assert stats["states"] > 0 and stats["judge_failures"] == stats["states"]
    failed = read_records(tmp_path / "bad" / "collect" / "records.jsonl")
    assert failed and all(c.score is None and "I like them all" in r.metadata["judge_reply"]
                          for r in failed for c in r.candidates)


def test_config_errors_name_the_key():
    c = load()
    c.base_model = "/models/x"
    with pytest.raises(StageError, match=r"config.collect.judge: an http judge needs base_url"):
        plan(c)
    c = load()
    with pytest.raises(StageError, match=r"config.collect.policy.path: empty"):
        plan(c)
    c = load("smoke")
    c.collect.ranking.n_candidates = 0
    with pytest.raises(StageError, match=r"config.collect.ranking: .*n_candidates=0"):
        plan(c)
