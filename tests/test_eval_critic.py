"""The paper eval stage's PRM-guided best-of-N (RAG-Gym Alg. 1): an agent entry with a critic samples n candidates
per state at its temperature and executes the critic's choice; config errors name the key before compute."""

import json

import ml_collections
import pytest

from fakes import BENCH, OverlapRetriever, ScriptedPolicy, load_passages
from jaxrag.env.mdp import read_episodes
from jaxrag.pipelines.eval import check_config, eval_stage, method_name

CALLS = []


def three_candidates(pcfg=None, workdir=None):
    """Candidate j of every state: 0 = a wrong answer, 1 = a search, 2 = "answer: Paris" (the first valid is 0)."""
    def respond(prompt, j):
        CALLS.append(j)
        return ("answer: wrong", "search: capital of France", "answer: Paris")[j % 3]
    return ScriptedPolicy(respond)


def small_retriever(rcfg=None, workdir=None):
    return OverlapRetriever(load_passages(limit=50))


def prefers_search_then_paris(spec, workdir, agent_name):
    """A scripted critic: r(s, a) = 1 for a search at a state with no history, for "Paris" after one; else 0."""
    def select(states, cands):
        out = []
        for s, cs in zip(states, cands):
            want = "query" if not s.history else "answer"
            out.append(next(i for i, c in enumerate(cs) if c.action.kind == want and
                            (want == "query" or c.action.text == "Paris")))
        return out
    return select


def config(tmp_path, **entry) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.stages = ["eval"]
    c.eval = ml_collections.ConfigDict({
        "fn": "jaxrag.pipelines.eval:eval_stage",
        "agents": [{"name": "react", "opts": {"mode": "plain"}},
                   {"name": "react", "opts": {"mode": "plain"}, **entry}],
        "datasets": [{"name": "HotpotQA", "path": str(BENCH / "hotpotqa_dev_500.jsonl"), "select": "first:2"}],
        "policy": {"fn": "test_eval_critic:three_candidates"},
        "retriever": {"fn": "test_eval_critic:small_retriever"},
        "rollout": {"k": 2, "max_steps": 3}, "tuning": "dpo", "index_recall": False,
    })
    return c


def test_critic_picks_the_executed_actions(tmp_path):
    c = config(tmp_path, critic={"fn": "test_eval_critic:prefers_search_then_paris"}, n=3, temperature=0.7,
               variant="n3")
    CALLS.clear()
    res = eval_stage(c, tmp_path, "eval")
    assert list(res) == ["react+dpo", "react+dpo+critic-n3"]
    plain = read_episodes(tmp_path / "eval" / "react+dpo__HotpotQA.episodes.jsonl")
    assert [[s.action.raw for s in ep.steps] for ep in plain] == [["answer: wrong"]] * 2   # greedy: one candidate
    eps = read_episodes(tmp_path / "eval" / "react+dpo+critic-n3__HotpotQA.episodes.jsonl")
    assert [[(s.action.kind, s.action.text) for s in ep.steps] for ep in eps] == \
        [[("query", "capital of France"), ("answer", "Paris")]] * 2
    # the plain row asked for one candidate per state (2 states), the critic row for 3 per state (4 states)
    assert CALLS.count(0) == 2 + 4 and CALLS.count(1) == 4 and CALLS.count(2) == 4
    rows = [json.loads(x) for x in (tmp_path / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["method"] == "react+dpo+critic-n3" and (rows[1]["n_candidates"], rows[1]["temperature"]) == (3, 0.7)
    assert "n_candidates" not in rows[0]


def test_method_names_match_the_published_tables():
    from jaxrag.pipelines.published import METHODS, is_known_method

    assert method_name({"name": "re2search", "critic": "stage:critic"}, "dpo") == "re2search+dpo+critic"
    assert method_name({"name": "re2search", "critic": "x", "variant": "llama"}) == "re2search+critic-llama"
    assert method_name({"name": "re2search", "critic": "x", "critic_tag": "orm"}) == "re2search+orm"
    assert METHODS[("rag_gym", "table3", "Llama-3.1-8B / Re²Search++")] == "re2search+dpo+critic"
    assert is_known_method(method_name({"name": "re2search", "critic": "x", "variant": "n16"}))


@pytest.mark.parametrize("entry, message", [
    ({"critic": "stage:critic", "n": 0}, r"config.eval.agents\[1\].n: 0: candidates per step must be an int >= 1"),
    ({"critic": "/nope/critic"}, r"config.eval.agents\[1\].critic: /nope/critic: no critic checkpoint here"),
    ({"critic": "stage:critic"}, r"config.eval.agents\[1\].critic: 'stage:critic': no stage 'critic' runs before"),
    ({"critic": ""}, r"config.eval.agents\[1\].critic: empty"),
    ({"n": 4}, r"config.eval.agents\[1\].n: only with a critic"),
])
def test_bad_critic_entries_fail_naming_the_key(tmp_path, entry, message):
    with pytest.raises(ValueError, match=message):
        check_config(config(tmp_path, **entry), "eval")


def test_policy_checkpoint_as_critic_fails_before_any_rollout(tmp_path):
    (tmp_path / "policy_only").mkdir()
    (tmp_path / "policy_only" / "config.json").write_text("{}")
    c = config(tmp_path, critic="policy_only")   # relative: checked when the stage starts, before any episode
    with pytest.raises(ValueError, match=r"config.eval.agents\[1\].critic: .*policy_only: no head.npz"):
        eval_stage(c, tmp_path, "eval")
    assert not list((tmp_path / "eval").glob("*.episodes.jsonl"))
