"""Over-long prompts: the agent keeps the question and the most recent steps (whole old steps dropped) within
the policy's budget; one rule for every design; counted, warned once; the engine wires the budget in."""
import dataclasses
import logging

import pytest

from fakes import OverlapRetriever, Passage, ScriptedPolicy
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import Action, Doc, State, Step
from jaxrag.env.rollout import RolloutConfig, rollout

QUESTION = "Who directed the film that won the 1961 award?"
HISTORY = [Step(Action("query", f"query number {i}"),
                docs=[Doc(f"d{i}{j}", 1.0, f"Title {i}.{j}", f"passage {i}.{j} " + "filler " * 20) for j in range(3)],
                summary=f"summary number {i}")
           for i in range(5)]
STATE = State(QUESTION, list(HISTORY))
DESIGNS = [("react", "chat"), ("search_o1", "chat"), ("re2search", "chat"), ("reasonrag", "chat"),
           ("smartsearch", "chat"), ("react", "plain"), ("re2search", "plain"), ("reasonrag", "plain")]


def budget(n_chars):
    return lambda prompt: len(prompt) <= n_chars


@pytest.mark.parametrize("name,mode", DESIGNS)
def test_keeps_question_and_most_recent_steps(name, mode):
    agent = get_agent(name, mode=mode)
    keep2 = agent.render(dataclasses.replace(STATE, history=HISTORY[3:]))
    out = agent.render(STATE, budget(len(keep2)))
    assert out == keep2                                  # the longest view that fits: the two latest searches
    assert QUESTION in out and "query number 4" in out and "query number 3" in out
    assert "query number 0" not in out and "query number 2" not in out
    assert agent.prompt_cuts == {"shortened": 1}
    assert agent.render(STATE, budget(10**6)) == agent.render(STATE)      # fits: byte for byte the same prompt


@pytest.mark.parametrize("name,mode", DESIGNS)
def test_then_the_latest_steps_documents_then_no_history(name, mode):
    agent = get_agent(name, mode=mode)
    one_doc = dataclasses.replace(STATE, history=[dataclasses.replace(HISTORY[4], docs=HISTORY[4].docs[:1])])
    target = agent.render(one_doc)
    out = agent.render(STATE, budget(len(target)))
    assert QUESTION in out and len(out) <= len(target)
    if agent.render(dataclasses.replace(STATE, history=HISTORY[4:])) != target:     # documents are shown
        assert out == target and "passage 4.0" in out and "passage 4.1" not in out
    bare = agent.render(State(QUESTION))
    assert agent.render(STATE, budget(len(bare))) == bare
    assert agent.render(STATE, budget(5)) == bare and agent.prompt_cuts["over_budget"] == 1   # the policy cuts


def test_rag_drops_lowest_ranked_documents():
    rag = get_agent("rag")
    state = State(QUESTION, [HISTORY[0]])
    two = rag.render(State(QUESTION, [dataclasses.replace(HISTORY[0], docs=HISTORY[0].docs[:2])]))
    out = rag.render(state, budget(len(two)))
    assert out == two and "passage 0.1" in out and "passage 0.2" not in out and QUESTION in out


def test_arena_drops_references_from_the_end():
    arena = get_agent("arena")
    refs = tuple(d for s in HISTORY for d in s.docs)
    state = State(QUESTION, references=refs)
    four = arena.render(State(QUESTION, references=refs[:4]))
    out = arena.render(state, budget(len(four)))
    assert out == four and "4. Title 1.0:" in out and "5. Title" not in out


def test_summary_prompt_drops_documents_from_the_end():
    agent = get_agent("search_o1")
    one = agent.render_summary(STATE, "q", HISTORY[0].docs[:1])
    assert agent.render_summary(STATE, "q", HISTORY[0].docs, budget(len(one))) == one
    assert agent.render_summary(STATE, "q", HISTORY[0].docs) == agent.render_summary(STATE, "q", HISTORY[0].docs, budget(10**6))


def test_warned_once_per_run_and_counted(caplog):
    agent = get_agent("react")
    keep1 = len(agent.render(dataclasses.replace(STATE, history=HISTORY[4:])))
    with caplog.at_level(logging.WARNING, logger="jaxrag.env.agents.base"):
        for _ in range(4):
            agent.render(STATE, budget(keep1))
        agent.render(STATE, budget(3))
        agent.render(STATE, budget(3))
    assert agent.prompt_cuts == {"shortened": 4, "over_budget": 2}
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 2 and "question kept" in msgs[0] and "policy cuts" in msgs[1]


class BudgetPolicy(ScriptedPolicy):
    """A scripted policy with a context limit: prompt_fits counts characters (a 1-char-per-token model)."""

    def __init__(self, respond, n_chars):
        super().__init__(respond)
        self.n_chars = n_chars

    def prompt_fits(self, prompt, max_new_tokens):
        return len(prompt) + max_new_tokens <= self.n_chars


def test_engine_renders_every_prompt_within_the_budget():
    passages = [Passage(f"p{i}", f"Title {i}", f"fact number {i} " + "words " * 15) for i in range(20)]
    examples = [{"id": f"q{i}", "question": f"question {i} about fact?", "golden_answers": [f"a{i}"]} for i in range(3)]

    def respond(prompt, j):         # search 4 times, then answer
        return "search: fact number\n" if prompt.count("\nsearch: ") < 4 else "answer: a0\n"
    free = BudgetPolicy(respond, 10**6)
    eps_free = rollout(free, OverlapRetriever(passages), get_agent("react", mode="plain"), examples,
                       RolloutConfig(k=2, max_new_tokens=10))
    pol, stats = BudgetPolicy(respond, 500), {}
    eps = rollout(pol, OverlapRetriever(passages), get_agent("react", mode="plain"), examples,
                  RolloutConfig(k=2, max_new_tokens=10, max_steps=6), stats=stats)
    prompts = [p for c in pol.calls for p in c["prompts"]]
    assert all(len(p) + 10 <= 500 and p.startswith("question: question ") for p in prompts)
    assert stats["prompts_shortened"] > 0 and stats["prompts_over_budget"] == 0
    assert all(e.num_searches >= 4 for e in eps)          # the dropped steps really were on the long prompts
    agent = get_agent("react", mode="plain")            # within budget: the prompts are the unbudgeted renders
    assert all(s.prompt == agent.render(e.state(t)) for e in eps_free for t, s in enumerate(e.steps))
    assert sorted(s.prompt for e in eps_free for s in e.steps) == sorted(p for c in free.calls for p in c["prompts"])
