"""Every agent end to end on the real benchmark files with BM25 (bm25s) over the multihop contexts corpus:
(1) a scripted generator whose canned texts drive every branch, (2) a tiny random JaxPolicy (garbage)."""
import pytest

from fakes import BENCH, ScriptedPolicy, bm25_over_corpus, tiny_jax_policy
from jaxrag.data.qa import load_qa
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import read_episodes, write_episodes
from jaxrag.env.rollout import RolloutConfig, rollout
from jaxrag.evaluate import episode_metrics

AGENTS = ["direct", "cot", "rag", "react", "search_o1", "re2search", "reasonrag", "arena", "smartsearch"]


@pytest.fixture(scope="module")
def bm25():
    return bm25_over_corpus()


@pytest.fixture(scope="module")
def hotpot():
    return load_qa(BENCH / "hotpotqa_dev_500.jsonl", "first:3")


# canned (query-step, answer-step) texts per agent: messy on purpose (fences, bold, missing closing tags)
QUERY = {
    "react": "The question needs the actress.\n**### Structured Output**\n```json\n{{\"generated_query\": \"{q}\",}}\n```",
    "search_o1": "Need info.\n{{'generated_query': '{q}'}}",
    "re2search": "### Step-by-step Reasoning\nI guess.\n### Structured Output\n```json\n{{'predicted_answer': 'guess', 'generated_query': '{q}',}}\n```",
    "reasonrag": "Not enough. So the next query is <query>{q}",
    "smartsearch": "<think>search first</think>\n<search> {q} </search>",
}
_JSON_ANSWER = "### Step-by-step Reasoning\nEnough.\n\n### Structured Output\n```json\n{{\"predicted_answer\": \"{a}\"}}\n``` done"
ANSWER = {
    "react": _JSON_ANSWER, "search_o1": '{{"predicted_answer": "{a}"', "direct": '```json\n{{\n"predicted_answer": "{a}"\n}}\n```',
    "cot": _JSON_ANSWER, "rag": _JSON_ANSWER,
    "re2search": '```json\n{{"predicted_answer": "{a}", "generated_query": "None"}}\n```',
    "reasonrag": "So the answer is <answer>{a}</answer>",
    "smartsearch": "<think>done</think><answer> The final answer is \\boxed{{{a}}} </answer>",
    "arena": "<relevance>[1, 2]</relevance><analysis>[1] and [2].</analysis><answer>{a}</answer>",
}
SUMMARY = {"search_o1": "Shirley Temple played Corliss Archer.", "re2search": "Shirley Temple.",
           "reasonrag": "Based on the query, the relevant evidence is <evidence>Shirley Temple</evidence>"}


def scripted(name, examples):
    """q0: one search then the gold answer; q1: a refusal (Invalid); q2: malformed text (Invalid)."""
    by_q = {ex.question: ex for ex in examples}

    def respond(prompt, j):
        ex = next(e for q, e in by_q.items() if q in prompt)
        if "Follow-up Query" in prompt:                     # Search-o1 / Re²Search summarizer
            return SUMMARY[name]
        if "extract relevant evidence" in prompt:          # ReasonRAG grounding
            return SUMMARY[name] if ex is examples[0] else "<evidence>None</evidence>"
        if ex is examples[1]:
            return "I'm sorry, I cannot answer that."
        if ex is examples[2]:
            return '{"predicted_answer": "", "generated_query": "None"' if name == "re2search" else "<<<>>> ```"
        searched = "Corliss Archer actress" in prompt       # the history holds the query
        if name in QUERY and not searched:
            return QUERY[name].format(q="Corliss Archer actress")
        return ANSWER[name].format(a=ex.golden_answers[0])
    return ScriptedPolicy(respond)


@pytest.mark.parametrize("name", AGENTS)
def test_scripted_every_branch(name, bm25, hotpot, tmp_path):
    agent = get_agent(name)
    pol = scripted(name, hotpot)
    eps = rollout(pol, bm25, agent, hotpot, RolloutConfig(k=3, max_steps=4, batch_size=3))
    good, refusal, malformed = eps
    assert good.done == "answer" and good.answer == hotpot[0].golden_answers[0] and good.reward == 1.0
    if name in QUERY or name == "rag":
        s = good.steps[0]
        assert s.action.kind == "query" and len(s.docs) == 3 and all(d.doc_id.startswith("mhctx_") for d in s.docs)
        assert good.num_searches == 1
    if agent.summarizes:
        assert good.steps[0].summary and good.steps[0].summary_prompt
    if name == "reasonrag":
        assert "<evidence>Shirley Temple</evidence>" in good.steps[1].prompt
    if name == "arena":
        assert len(good.references) == len(hotpot[0].contexts) and good.metadata["gold_ref_ids"]
    if name == "rag":   # RAG's first action is scripted: the refusal comes at step 2
        assert refusal.steps[0].action.kind == "query"
    for ep in (refusal, malformed):
        assert ep.done == "invalid" and ep.answer is None and ep.steps[-1].action.kind == "invalid"
    m = episode_metrics(eps)
    assert m["em"] == pytest.approx(1 / 3) and m["episodes_with_invalid"] == pytest.approx(2 / 3)
    assert m["invalid_rate"] == pytest.approx(2 / sum(len(e.steps) for e in eps))
    if name == "arena":
        assert m["arena_format"] == pytest.approx(1 / 3)
    back = read_episodes(write_episodes(tmp_path / "e.jsonl", eps))
    assert back == eps


@pytest.fixture(scope="module")
def tiny():
    return tiny_jax_policy()


@pytest.mark.parametrize("name,mode", [(a, "chat") for a in AGENTS] + [("react", "plain"), ("re2search", "plain")])
def test_tiny_random_model(name, mode, tiny, bm25, hotpot):
    eps = rollout(tiny, bm25, get_agent(name, mode=mode), hotpot[:2],
                  RolloutConfig(k=2, max_steps=3, max_new_tokens=8, summary_max_new_tokens=8, max_invalid=2))
    assert len(eps) == 2
    for ep in eps:
        assert ep.done in ("answer", "invalid", "max_steps") and 1 <= len(ep.steps) <= 3
        gen = [s for s in ep.steps if s.prompt]
        assert all(len(s.token_ids) == len(s.logprobs) <= 8 for s in gen)
        assert all(lp <= 0.0 for s in gen for lp in s.logprobs)
    m = episode_metrics(eps)
    assert 0.0 <= m["invalid_rate"] <= 1.0 and m["n"] == 2


@pytest.mark.parametrize("stop_at,stop,fmt", [("eos", None, 0.0), ("answer", ["</answer>"], 1.0)])
def test_arena_stop_option(stop_at, stop, fmt, bm25, hotpot):
    """ARENA's stop: "eos" (the default, the released vLLM sampling: no stop string) samples on past </answer>, so
    trailing text on the answer's line reaches the reward and costs the format point; "answer" (the old stop) cuts
    the reply at </answer>. The policy sees the option as its stop strings."""
    reply = "<relevance>[1, 2]</relevance>\n<analysis>[1] and [2].</analysis>\n<answer>{a}</answer> I hope this helps."
    pol = ScriptedPolicy(lambda p, j: reply.format(a=hotpot[0].golden_answers[0]))
    agent = get_agent("arena", **({} if stop_at == "eos" else {"stop_at": stop_at}))
    eps = rollout(pol, bm25, agent, hotpot[:1], RolloutConfig(k=3, max_steps=1, temperature=0.9, max_new_tokens=256))
    assert pol.calls and [(c["stop"], c["temperature"]) for c in pol.calls] == [(stop, 0.9)] * len(pol.calls)
    raw = eps[0].steps[-1].action.raw
    assert raw.endswith("I hope this helps.") == (stop_at == "eos")
    m = episode_metrics(eps)
    assert m["em"] == 1.0 and m["arena_format"] == fmt
