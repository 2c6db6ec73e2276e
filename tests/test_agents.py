"""Agents: rendering, parsing of messy generations, and the format/parse inverse (property-based)."""
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from jaxrag.env.agents import available, get_agent
from jaxrag.env.mdp import Action, Doc, State, Step

AGENTS = ["direct", "cot", "rag", "react", "search_o1", "re2search", "reasonrag", "arena", "smartsearch"]
ANSWER_ONLY = {"direct", "cot", "rag", "arena"}
RAG_GYM = {"direct", "cot", "rag", "react", "search_o1", "re2search"}


def test_registry_lists_every_design_and_rejects_unknown():
    assert set(AGENTS) <= set(available())
    assert get_agent("Search-o1").name == "search_o1" and get_agent("re²search").name == "re2search"
    with pytest.raises(KeyError, match="unknown agent 'nope'"):
        get_agent("nope")
    with pytest.raises(ValueError, match="mode"):
        get_agent("react", mode="fancy")


WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,?'-()éü", min_size=1,
                max_size=40).map(lambda s: " ".join(s.split())).filter(
                    lambda s: s and s.lower() not in {"none", "null", "n/a", "no query"} and not s.endswith(" is")
                    and s.strip(".") != "")


@st.composite
def actions(draw, agent_name: str, mode: str):
    kind = "answer" if agent_name in ANSWER_ONLY else draw(st.sampled_from(["query", "answer"]))
    text = draw(WORDS)
    extra = {}
    opt = lambda: draw(st.booleans())
    if agent_name == "arena":
        extra = {"relevance": draw(st.lists(st.integers(0, 30), max_size=5)), "analysis": draw(st.one_of(st.just(""), WORDS))}
    elif agent_name == "re2search" and kind == "query" and opt():
        extra["predicted_answer"] = draw(WORDS.filter(lambda s: ";" not in s))
    if mode == "chat":
        if agent_name in ("direct", "cot", "rag", "react", "search_o1", "reasonrag", "re2search") and opt():
            extra["reasoning"] = draw(WORDS)
        if agent_name == "re2search" and opt():
            extra["claims"] = draw(WORDS)
        if agent_name == "smartsearch" and opt():
            extra["think"] = draw(WORDS)
    return Action(kind, text, "", extra)


@pytest.mark.parametrize("mode", ["chat", "plain"])
@pytest.mark.parametrize("name", AGENTS)
def test_parse_inverts_format(name, mode):
    agent = get_agent(name, mode=mode)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(actions(name, mode), st.sampled_from(["", "  ", "\n", " \n\t"]))
    def check(a, pad):
        text = agent.format(a)
        assert agent.parse(text) == a, text
        if mode == "chat":                      # surrounding whitespace never matters
            assert agent.parse(pad + text + pad) == a
        assert agent.parse(text).raw == text
    check()


@pytest.mark.parametrize("mode", ["chat", "plain"])
@pytest.mark.parametrize("name", AGENTS)
def test_parse_never_raises(name, mode):
    agent = get_agent(name, mode=mode)

    @settings(max_examples=150, deadline=None)
    @given(st.text())
    def check(s):
        a = agent.parse(s)
        assert a.kind in ("query", "answer", "invalid") and a.raw == s
        if a.kind == "invalid":
            assert a.text == "" and a.extra.get("error")
        else:
            assert a.text and a.text == " ".join(a.text.split())
    check()


CASES = [
    # (agent, messy generation, kind, text)
    ("react", "I should look up X.\n\n### Structured Output\n```json\n{\"generated_query\": \"Who founded  X?\",}\n```",
     "query", "Who founded X?"),
    ("react", "### Step-by-step Reasoning\nr {\"generated_query\": \"no\"}\n\n**### Structured Output**:\n```json\n{\n"
     "  \"predicted_answer\": \"Paris\"\n}\n``` and some trailing text", "answer", "Paris"),
    ("react", "{'generated_query': ['birth place of Y', 'z'], 'predicted_answer': None}", "query", "birth place of Y"),
    ("react", '{"generated_query": "None", "predicted_answer": 1932}', "answer", "1932"),
    ("react", "I cannot help with that.", "invalid", ""),
    ("react", "Reasoning.\nQuery: who is X", "invalid", ""),          # the old marker lines are not the format
    ("search_o1", '```json\n{"generated_query": "capital of France"}\n```', "query", "capital of France"),
    ("direct", '```json\n{\n"predicted_answer": "C"\n}\n```', "answer", "C"),
    ("direct", '{"generated_query": "something"}', "invalid", ""),
    ("direct", "Answer: C", "invalid", ""),
    ("cot", "Step 1 ... Step 2 ...\n### Structured Output\n```json\n{\"predicted_answer\": \"1932\"\n```", "answer", "1932"),
    ("cot", 'Reasoning {"predicted_answer": "wrong"}\n### Structured Output\nnothing here', "invalid", ""),
    ("rag", "### Structured Output\npredicted_answer: \"Paris\"", "answer", "Paris"),
    ("re2search", "### Step-by-step Reasoning\nr\n### Structured Output\n```json\n{\"predicted_answer\": \"Paris\", "
     "\"generated_query\": \"capital of France\",}\n```", "query", "capital of France"),
    ("re2search", "```json\n{'predicted_answer': 'Paris', 'generated_query': None}\n```", "answer", "Paris"),
    ("re2search", "{“predicted_answer”: “Paris”, “generated_query”: “None”}", "answer", "Paris"),
    ("re2search", '{"predicted_answer": "Paris", "generated_query": "where is the Louvre', "query", "where is the Louvre"),
    ("re2search", '{"predicted_answer": "", "generated_query": "None"}', "invalid", ""),
    ("reasonrag", "The film is X. So the next query is <query>director of X", "query", "director of X"),
    ("reasonrag", "So the answer is <answer> Il Coraggio </answer>", "answer", "Il Coraggio"),
    ("reasonrag", "<evidence>e</evidence>", "invalid", ""),
    ("smartsearch", "<think>hmm</think>\n<search> Douglas D. Scott sites", "query", "Douglas D. Scott sites"),
    ("smartsearch", "<think>ok</think><answer>The final answer is \\boxed{\\text{June 25, 1876}}</answer>", "answer",
     "June 25, 1876"),
    ("smartsearch", "so it is \\boxed{1876", "answer", "1876"),
    ("smartsearch", "<answer> Paris </answer>", "answer", "Paris"),
    ("arena", "<relevance>[1,5]</relevance><analysis>[1] says</analysis><answer>yes</answer>", "answer", "yes"),
    ("arena", "<relevance>[1,5]</relevance><analysis>no answer", "invalid", ""),
]


@pytest.mark.parametrize("name,text,kind,value", CASES)
def test_messy_generations(name, text, kind, value):
    a = get_agent(name).parse(text)
    assert (a.kind, a.text) == (kind, value)


def test_re2search_keeps_the_predicted_answer_with_a_query():
    a = get_agent("re2search").parse('{"predicted_answer": "Paris", "generated_query": "capital of France"}')
    assert a.extra["predicted_answer"] == "Paris"


def test_arena_relevance_ids():
    a = get_agent("arena").parse("<relevance>[2, 7]</relevance><analysis>x</analysis><answer>a</answer>")
    assert a.extra == {"relevance": [2, 7], "analysis": "x"}


STATE = State("Who directed Il Coraggio?",
              [Step(Action("query", "Il Coraggio film"), docs=[Doc("d1", 1.0, "Il Coraggio", "A 1955 film by D. Paolella.")],
                    summary="Domenico Paolella")],
              references=(Doc("r1", 0.0, "Ref", "Reference text."),))
MC = State("Which drug?", [], choices=("Aspirin", "Metformin", "Insulin", "Heparin"))


@pytest.mark.parametrize("name", AGENTS)
def test_chat_prompts_hold_the_papers_pieces(name):
    agent = get_agent(name)
    p = agent.render(STATE)
    assert "Who directed Il Coraggio?" in p
    if name in ("react", "rag", "smartsearch"):
        assert "A 1955 film by D. Paolella." in p            # documents in the history
    if name in ("search_o1", "re2search"):
        assert "Domenico Paolella" in p                       # summaries (re2search chat default)
    if name == "reasonrag":
        assert p.endswith("<evidence>Domenico Paolella</evidence> ")
    if name == "arena":
        assert "1. Ref: Reference text." in p and "<references>" in p
    mc = agent.render(MC)
    if name in RAG_GYM:     # the released pipeline: f"{question} {options}", options a {letter: text} dict
        assert "Which drug? {'A': 'Aspirin', 'B': 'Metformin', 'C': 'Insulin', 'D': 'Heparin'}" in mc
    else:
        assert "A. Aspirin" in mc and "D. Heparin" in mc


def test_paper_templates():
    assert "Unverified Claim Identification" in get_agent("re2search").render(STATE)
    s = get_agent("search_o1").render_summary(STATE, "Il Coraggio film", STATE.history[0].docs)
    assert "### Follow-up Query\nIl Coraggio film" in s and "explicitly point this out" in s
    g = get_agent("reasonrag").render_summary(STATE, "q", STATE.history[0].docs)
    assert "<evidence>None</evidence>" in g and "A 1955 film" in g
    assert "\\boxed{}" in get_agent("smartsearch").render(STATE)


def test_chat_template_is_used_when_a_tokenizer_is_given():
    class Tok:
        def chat(self, messages, add_generation_prompt=True):
            return "".join(f"<|{m['role']}|>{m['content']}" for m in messages) + "<|assistant|>"
    p = get_agent("reasonrag", tokenizer=Tok()).render(STATE)
    assert p.startswith("<|system|>You are a question-answering assistant")
    assert "<|assistant|>So the next query is <query>Il Coraggio film</query>" in p


def test_plain_prompts_are_short():
    for name in AGENTS:
        p = get_agent(name, mode="plain").render(STATE)
        assert p.startswith("question: Who directed Il Coraggio?\n") and len(p) < 200, (name, p)
    assert get_agent("react", mode="plain").render(STATE) == (
        "question: Who directed Il Coraggio?\nsearch: Il Coraggio film\ndoc: Il Coraggio: A 1955 film by D. Paolella.\n")
    assert get_agent("re2search", mode="plain").render(STATE) == get_agent("react", mode="plain").render(STATE)
    assert get_agent("react", mode="plain").stop == ("\n",)


def test_rag_first_action_is_the_question():
    rag = get_agent("rag")
    a = rag.first_action(State("Who is X?"))
    assert (a.kind, a.text) == ("query", "Who is X?")
    assert rag.first_action(STATE) is None
