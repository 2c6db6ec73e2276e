"""ARENA's ablations (003 §5.3, Fig. 3; App. I): their rewards against hand-computed cases, the Naive-GRPO agent's
released template and format, and configs/arena/fig3.py: one RL stage and one eval row per variant, run end to end
by its smoke variant."""
import http.server
import importlib.util
import json
from pathlib import Path

import pytest
from fakes import loopback

from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import ANSWER, Doc, Episode, State, Step
from jaxrag.main import StageError, plan, run
from jaxrag.pipelines.published import METHODS
from jaxrag.supervision.arena_reward import arena_episode_reward, naive_format_score
from jaxrag.supervision.rewards import get_reward, reward_fn

ROOT = Path(__file__).resolve().parents[1]
REL, ANA = "<relevance>[1, 3]</relevance>\n", "<analysis>[1] and [3] say so</analysis>\n"


def episode(agent: str, text: str, gold=("Paris",)) -> Episode:
    action = get_agent(agent).parse(text)
    return Episode("q", "capital?", list(gold), agent=agent, steps=[Step(action)],
                   answer=action.text if action.kind == ANSWER else None,
                   done="answer" if action.kind == ANSWER else "invalid", metadata={"gold_ref_ids": [1, 3]})


def test_no_bonus_reward_keeps_the_three_terms():
    perfect = episode("arena", REL + ANA + "<answer>Paris</answer>")
    assert get_reward("arena")(perfect).total == 13.0
    r = get_reward("arena_nobonus")(perfect)
    assert r.total == 3.0 and r.components == {"format": 1, "accuracy": 1, "relevance": 1, "bonus": 0}


@pytest.mark.parametrize("answer, acc, bonus", [
    ("Paris", 1.0, 10.0),                       # F1 1: the bonus still applies
    ("the Eiffel Tower, Paris", 0.5, 0.0),      # normalized: eiffel tower paris -> P 1/3, R 1 -> F1 0.5
    ("London", 0.0, 0.0),
])
def test_f1_accuracy_reward(answer, acc, bonus):
    r = get_reward("arena_f1acc")(episode("arena", REL + ANA + f"<answer>{answer}</answer>"))
    assert r.components == {"format": 1, "accuracy": pytest.approx(acc), "relevance": 1, "bonus": bonus}
    assert r.total == pytest.approx(2 + acc + bonus)
    with pytest.raises(ValueError, match=r"accuracy must be one of \['em', 'f1'\] or a function, got 'lj'"):
        arena_episode_reward(episode("arena", REL + ANA + "<answer>Paris</answer>"), accuracy="lj")


@pytest.mark.parametrize("text, fmt, acc", [
    ("<think>\n[1] says Paris\n</think>\n<answer>\nParis\n</answer>", 1, 1),
    ("<think>x</think><answer>London</answer>", 1, 0),
    ("Sure. <think>x</think><answer>Paris</answer>", 0, 1),            # text before <think>
    ("<think>x</think><answer>Paris</answer> done", 0, 1),             # text after </answer> on its line
    ("<think>x</think><answer>Paris</answer>\nmore", 1, 1),            # MULTILINE: '$' ends any line (released)
    ("<answer>Paris</answer>", 0, 1),                                  # no <think>
    (REL + ANA + "<answer>Paris</answer>", 0, 1),                      # ARENA's sections are not this format
    ("<think>no answer</think>", 0, 0),                                # Invalid
])
def test_naive_grpo_reward_is_format_plus_accuracy(text, fmt, acc):
    r = get_reward("arena_naive")(episode("arena_naive", text))
    assert r.components == {"format": fmt, "accuracy": acc} and r.total == fmt + acc
    assert naive_format_score(text) == fmt


class FakeJudge:
    """judge_answers by a table answer -> verdict (None: the judge failed); counts calls and answers asked about."""
    def __init__(self, verdicts):
        self.verdicts, self.calls, self.asked = verdicts, 0, []

    def judge_answers(self, items):
        self.calls += 1
        self.asked += [r for _, r in items if r]
        return [(self.verdicts[r], None) if r else (False, None) for _, r in items]


def test_lj_accuracy_reward_takes_the_judges_verdict():
    """LJ accuracy: yes 1 (a synonym EM misses earns the bonus), no 0, a failed judge 0.5 (the released score of
    a reply that is neither) counted in lj_failed, no answer (an Invalid reply: no format; its <relevance> still
    scores, as in the released code) accuracy 0 without asking; one judge call for the batch."""
    judge = FakeJudge({"Paris": True, "City of Light": True, "London": False, "Lyon": None})
    eps = [episode("arena", REL + ANA + f"<answer>{a}</answer>") for a in ("Paris", "City of Light", "London", "Lyon")]
    eps.append(episode("arena", REL + ANA + "no answer"))
    fn = get_reward("arena_ljacc", answer_judge=judge)
    fn.prepare(eps)
    got = [(r.total, r.components["accuracy"], r.components["lj_failed"]) for r in map(fn, eps)]
    assert got == [(13.0, 1.0, 0.0), (13.0, 1.0, 0.0), (2.0, 0.0, 0.0), (2.5, 0.5, 1.0), (1.0, 0.0, 0.0)]
    assert judge.calls == 1 and judge.asked == ["Paris", "City of Light", "London", "Lyon"]
    assert eps[3].metadata["lj"] == {"verdict": None} and eps[4].metadata["lj"] == {"verdict": False}
    with pytest.raises(ValueError, match=r"reward 'arena_ljacc' asks an LLM judge .* answer_judge.base_url"):
        get_reward("arena_ljacc")
    mixed = reward_fn("arena_ljacc+0.5*em", answer_judge=judge)
    fresh = episode("arena", REL + ANA + "<answer>Paris</answer>")
    mixed.prepare([fresh])   # a weighted spec prepares its judged part
    assert judge.calls == 2 and mixed(fresh).total == 13.5 and judge.calls == 2


def test_naive_agent_renders_the_released_template_and_round_trips():
    agent = get_agent("arena_naive", max_doc_chars=None)
    docs = (Doc("a", title="Paris", text="Paris is the capital of France."),
            Doc("b", title="Lyon", text="Lyon is a city."))
    prompt = agent.render(State("What is the capital of France?", references=docs))
    assert prompt.startswith("Answer the question based on the given information. Your response MUST strictly "
                             "follow this format:\n\n<think>\n[Analyze the question")
    assert ("**References**:\n1. Paris: Paris is the capital of France.\n2. Lyon: Lyon is a city.\n\n"
            "**Question**: \nWhat is the capital of France?\n") in prompt
    one = agent.render(State("Q?", references=docs[:1]))
    assert "**References**:\nParis: Paris is the capital of France.\n" in one   # one reference: unnumbered
    action = agent.parse("<think>\nref 1\n</think>\n<answer>\nParis\n</answer>")
    assert (action.kind, action.text, action.extra) == (ANSWER, "Paris", {"analysis": "ref 1"})
    assert agent.parse(agent.format(action)) == action
    assert agent.parse("<think>no answer</think>").kind == "invalid"


def load(variant: str = ""):
    spec = importlib.util.spec_from_file_location("cfg_arena_fig3", ROOT / "configs" / "arena" / "fig3.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(variant)


def test_fig3_rows_carry_their_variant_and_arena_settings():
    c = load()
    rl = {n: (c[n].agent.name, c[n].reward, c[n].train.grpo.kl_estimator) for n in c.stages if n.startswith("rl_")}
    assert rl == {"rl_arena": ("arena", "arena", "k2"), "rl_naive": ("arena_naive", "arena_naive", "k3"),
                  "rl_nokl": ("arena", "arena", "k3"), "rl_nobonus": ("arena", "arena_nobonus", "k2"),
                  "rl_f1acc": ("arena", "arena_f1acc", "k2"), "rl_ljacc": ("arena", "arena_ljacc", "k2")}
    for n in rl:   # everything else is ARENA's GRPO
        s = c[n]
        assert (s.rl.group_size, s.train.grpo.beta, s.train.optimizer.lr, s.rl.temperature, s.rl.max_new_tokens) == \
            (7, 0.04, 3e-6, 0.9, 256)
    c.base_model, c.train_questions = "/models/qwen", "/data/train.jsonl"
    assert {c[n].policy.path for n in rl} == {"/models/qwen"}
    assert {c[n].questions.path for n in rl} == {"/data/train.jsonl"}
    assert [d["name"] for d in c.eval_nokl.datasets] == ["HotpotQA"] and c.eval_nokl.rollout.temperature == 0.9
    with pytest.raises(StageError, match=r"config.rl_ljacc.reward: reward 'arena_ljacc' asks an LLM judge"):
        plan(c)   # LJ accuracy's reward needs the judge
    c.judge_url = "https://api.openai.com/v1"
    assert len(plan(c)) == len(c.stages) == 12
    assert c.rl_ljacc.answer_judge.base_url == c.eval_arena.judge.base_url == c.judge_url   # one place names it
    assert (c.rl_ljacc.answer_judge.model, c.rl_ljacc.reward) == ("gpt-4o-2024-11-20", "arena_ljacc")


class _YesJudge(http.server.BaseHTTPRequestHandler):
    """A stand-in OpenAI endpoint: every LJ question is answered "yes"."""
    asked: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).asked.append(body["messages"][0]["content"])
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": "yes"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def fig3_smoke(tmp_path_factory):
    """The smoke variant with its LJ-accuracy row put back, against the stand-in judge."""
    wd = tmp_path_factory.mktemp("arena_fig3")
    c = load("smoke")
    c.stages = c.stages[:6] + ["rl_ljacc"] + c.stages[6:] + ["eval_ljacc"]
    with loopback(_YesJudge) as url:
        c.judge_url = url
        return run(c, wd), wd


def test_fig3_smoke_trains_and_evaluates_every_row(fig3_smoke):
    ran, wd = fig3_smoke
    assert ran == ["setup", "rl_arena", "rl_naive", "rl_nokl", "rl_nobonus", "rl_f1acc", "rl_ljacc", "eval_arena",
                   "eval_naive", "eval_nokl", "eval_nobonus", "eval_f1acc", "eval_ljacc"]
    methods = {}
    for name in ran[7:]:
        for line in (wd / name / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            methods.setdefault(row["method"], set()).add(row["dataset"])
            assert "lj" in row and row["lj_failed"] == 0   # every row's eval asked the judge (judge_url)
    assert methods == {m: {"HotpotQA"} for m in ("arena+grpo", "arena_naive+grpo", "arena+grpo-no_kl_stabilization",
                                                  "arena+grpo-no_bonus", "arena+grpo-f1_accuracy",
                                                  "arena+grpo-lj_accuracy")}
    assert METHODS[("arena", "table10", "ARENA-7B-nobonus (step 95)")] == "arena+grpo-no_bonus"
    # each RL stage scored its episodes with its own reward: the naive one has no relevance or bonus term
    comps = {}
    for name in ran[1:7]:
        steps = [json.loads(x) for x in (wd / name / "metrics.jsonl").read_text().splitlines()]
        comps[name] = {k.split("/", 1)[1] for s in steps for k in s if k.startswith("reward/")} - \
            {"mean", "std", "groups_without_signal"}
    assert comps["rl_naive"] == {"format", "accuracy"}
    assert comps["rl_nobonus"] == comps["rl_f1acc"] == {"format", "accuracy", "relevance", "bonus"}
    assert comps["rl_ljacc"] == {"format", "accuracy", "relevance", "bonus", "lj_failed"}
    # the LJ row's episodes each carry the judge's verdict; an answered one was asked about with ARENA's prompt
    eps = [json.loads(x) for x in (wd / "rl_ljacc" / "episodes.jsonl").read_text().splitlines()]
    assert eps and all(e["metadata"]["lj"]["verdict"] is (e["answer"] is not None and bool(e["answer"].strip()))
                       for e in eps)
