"""The batched engine: one policy call per engine step, batched retrieval/summaries, refill, best-of-N."""
import pytest

from fakes import OverlapRetriever, Passage, QueuePolicy, ScriptedPolicy
from jaxrag.env.agents import get_agent
from jaxrag.env.rollout import RolloutConfig, candidates, rollout

PASSAGES = [Passage(f"p{i}", f"Title {i}", f"fact number {i} about topic{i % 3}") for i in range(30)]
EXAMPLES = [{"id": f"q{i}", "question": f"question {i} about topic{i % 3}?", "golden_answers": [f"ans{i}"]}
            for i in range(7)]


def react_by_searches(prompt: str, j: int) -> str:
    """Plain ReAct: search twice, then answer with the id found in the question."""
    qnum = prompt.split("question: question ")[1].split(" ")[0]
    n = prompt.count("\nsearch: ")
    return f"search: topic fact {n}\n" if n < 2 else f"answer: ans{qnum}\n"


def test_batched_engine_counts_and_order():
    pol, ret = ScriptedPolicy(react_by_searches), OverlapRetriever(PASSAGES)
    stats = {}
    eps = rollout(pol, ret, get_agent("react", mode="plain"), EXAMPLES, RolloutConfig(k=2, batch_size=3, gamma=0.5),
                  stats=stats)
    assert [e.qid for e in eps] == [f"q{i}" for i in range(7)]
    assert all(e.done == "answer" and e.reward == 1.0 and e.num_searches == 2 for e in eps)
    assert all(e.ret == pytest.approx(0.25) for e in eps)             # γ^2 · 1
    assert all(len(s.docs) == 2 for e in eps for s in e.steps[:2])
    # 7 episodes x 3 steps, batch 3: every generate call holds <= 3 prompts; retrieval batched per step
    assert sum(len(c["prompts"]) for c in pol.calls) == 21 and max(len(c["prompts"]) for c in pol.calls) == 3
    assert len(pol.calls) == stats["policy_calls"] == stats["engine_steps"]
    assert all(len(q) <= 3 for q, _ in ret.calls) and sum(len(q) for q, _ in ret.calls) == 14
    assert pol.calls[0]["stop"] == ["\n"]
    assert stats["host_s"] >= 0 and stats["generate_s"] > 0
    # episode_reward=False: the caller (the RL loop) owns ep.reward; the answer step still carries its reward
    eps = rollout(ScriptedPolicy(react_by_searches), OverlapRetriever(PASSAGES), get_agent("react", mode="plain"),
                  EXAMPLES[:2], RolloutConfig(k=2, batch_size=3, episode_reward=False))
    assert all(e.reward == 0.0 and e.steps[-1].reward == 1.0 and e.done == "answer" for e in eps)


def test_refill_keeps_the_batch_full():
    # q0 answers at once, the others search 2x: the freed slot is refilled in the next engine step
    def respond(p, j):
        return "answer: ans0" if "question 0 " in p else react_by_searches(p, j)
    pol = ScriptedPolicy(respond)
    rollout(pol, OverlapRetriever(PASSAGES), get_agent("react", mode="plain"), EXAMPLES[:4], RolloutConfig(batch_size=3))
    assert [len(c["prompts"]) for c in pol.calls][:2] == [3, 3]


def test_invalid_and_max_steps():
    eps = rollout(QueuePolicy(["gibberish"]), OverlapRetriever(PASSAGES), get_agent("react", mode="plain"), EXAMPLES[:2])
    assert all(e.done == "invalid" and e.answer is None and e.num_invalid == 1 for e in eps)
    assert eps[0].steps[0].action.extra["error"]
    eps = rollout(QueuePolicy(["search: topic0"]), OverlapRetriever(PASSAGES), get_agent("react", mode="plain"),
                  EXAMPLES[:2], RolloutConfig(max_steps=4))
    assert all(e.done == "max_steps" and len(e.steps) == 4 and e.reward == 0.0 for e in eps)
    eps = rollout(QueuePolicy(["junk"]), OverlapRetriever(PASSAGES), get_agent("react", mode="plain"),
                  EXAMPLES[:1], RolloutConfig(max_steps=3, max_invalid=5))
    assert eps[0].done == "max_steps" and eps[0].num_invalid == 3


def test_re2search_last_step_uses_its_predicted_answer():
    eps = rollout(QueuePolicy(["guess: ans0 ; search: more"]), OverlapRetriever(PASSAGES),
                  get_agent("re2search", mode="plain"), EXAMPLES[:1], RolloutConfig(max_steps=3))
    assert eps[0].done == "answer" and eps[0].answer == "ans0" and eps[0].num_searches == 2
    assert eps[0].steps[-1].action.extra["forced_by_max_steps"]


def test_candidates_and_critic_select():
    pol = ScriptedPolicy(lambda p, j: ["junk", "search: topic1", "answer: ans0"][j % 3])
    agent = get_agent("react", mode="plain")
    prompts, cands = candidates(pol, agent, [agent_state("question 0 about topic0?")], n=3, temperature=1.0)
    assert len(pol.calls) == 1 and pol.calls[0]["n"] == 3
    assert [c.action.kind for c in cands[0]] == ["invalid", "query", "answer"]

    def critic(states, cs):                   # prefer answers
        return [max(range(len(c)), key=lambda i: c[i].action.kind == "answer") for c in cs]
    eps = rollout(pol, OverlapRetriever(PASSAGES), agent, EXAMPLES[:2], RolloutConfig(n_candidates=3, temperature=1.0),
                  select=critic)
    assert eps[0].answer == "ans0" and eps[0].reward == 1.0 and len(eps[0].steps[0].candidates) == 2
    eps = rollout(pol, OverlapRetriever(PASSAGES), agent, EXAMPLES[:1], RolloutConfig(n_candidates=3, max_steps=2))
    assert eps[0].steps[0].action.kind == "query"            # default: first valid candidate


def agent_state(q):
    from jaxrag.env.mdp import State
    return State(q)


def test_summaries_are_one_batched_call_with_their_own_policy():
    summ = ScriptedPolicy(lambda p, j: "summary: the fact")
    eps = rollout(ScriptedPolicy(react_by_searches), OverlapRetriever(PASSAGES), get_agent("search_o1", mode="plain"),
                  EXAMPLES[:3], RolloutConfig(batch_size=3), summarizer=summ)
    assert [len(c["prompts"]) for c in summ.calls] == [3, 3]
    assert all(s.summary == "the fact" and s.summary_prompt for e in eps for s in e.steps[:2])
    assert "summary: the fact" in eps[0].steps[2].prompt


def test_continue_partial_episode_and_arena_references_from_retrieval():
    pol = ScriptedPolicy(react_by_searches)
    first = rollout(pol, OverlapRetriever(PASSAGES), get_agent("react", mode="plain"), EXAMPLES[:1], RolloutConfig())[0]
    part = first.__class__(**{**first.__dict__, "steps": first.steps[:1], "done": "", "answer": None})
    cont = rollout(pol, OverlapRetriever(PASSAGES), get_agent("react", mode="plain"), [part])[0]
    assert [s.action for s in cont.steps] == [s.action for s in first.steps]
    ret = OverlapRetriever(PASSAGES)
    ep = rollout(QueuePolicy(["<relevance>[1]</relevance><analysis>a</analysis><answer>ans0</answer>"]), ret,
                 get_agent("arena"), EXAMPLES[:1], RolloutConfig(k=3))[0]
    assert len(ep.references) == 3 and ret.calls[0][0] == [EXAMPLES[0]["question"]] and ep.reward == 1.0


def test_wrong_sized_policy_output_is_a_clear_error():
    class Bad:
        def generate(self, prompts, **kw):
            return []
    with pytest.raises(ValueError, match="0 completion lists for 1 prompts"):
        rollout(Bad(), OverlapRetriever(PASSAGES), get_agent("react"), EXAMPLES[:1])
