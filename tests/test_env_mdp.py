import json

import pytest

from jaxrag.env.mdp import Action, Doc, Episode, Step, answer_reward, discounted_return, read_episodes, write_episodes


def _episode():
    s1 = Step(Action("query", "who wrote x", "Query: who wrote x", {"reasoning": "r"}), prompt="P1",
              docs=[Doc("d1", 1.5, "T", "text é")], summary="S", token_ids=[5, 6], logprobs=[-0.1, -0.2],
              finish_reason="stop", timing={"generate_s": 0.01}, candidates=[{"action": {"kind": "invalid"}}])
    s2 = Step(Action("answer", "Paris", "Answer: Paris"), prompt="P2", reward=1.0)
    return Episode("q1", "Q?", ["Paris"], agent="react", steps=[s1, s2], answer="Paris", reward=1.0, ret=0.9,
                   done="answer", references=[Doc("r", 0.0, "t", "x")], metadata={"dataset": "d"})


def test_episode_jsonl_roundtrip(tmp_path):
    ep = _episode()
    p = write_episodes(tmp_path / "e.jsonl", [ep, ep])
    back = read_episodes(p)
    assert back == [ep, ep]
    assert back[0].steps[0].action.raw == "Query: who wrote x"   # raw is kept even though not compared
    assert back[0].num_searches == 1 and back[0].state().queries == ["who wrote x"]


def test_bad_episode_line_names_file_and_line(tmp_path):
    p = tmp_path / "e.jsonl"
    p.write_text(json.dumps(_episode().to_json()) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"e\.jsonl:2"):
        read_episodes(p)


def test_action_kind_checked():
    with pytest.raises(ValueError, match="kind"):
        Action("search", "x")


def test_discounted_return_and_reward():
    assert discounted_return([0, 0, 1.0], 0.9) == pytest.approx(0.81)
    assert answer_reward("Barack Obama", ["Obama"], "f1") == pytest.approx(2 / 3)
    assert answer_reward("obama", ["Obama"], "em") == 1.0
    assert answer_reward("B", ["two"], "auto", ["one", "two"]) == 1.0
    assert answer_reward(None, ["x"]) == 0.0
    with pytest.raises(ValueError, match="unknown reward"):
        answer_reward("a", ["a"], "bleu")
