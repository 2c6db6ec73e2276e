"""The papers' prompts verbatim (RAG-Gym's released templates), the must-answer step, the document cut."""
import pytest

from fakes import OverlapRetriever, Passage, ScriptedPolicy
from jaxrag.env.agents import base, get_agent
from jaxrag.env.mdp import Action, Doc, State, Step
from jaxrag.env.rollout import RolloutConfig, rollout

AGENTS = ["direct", "cot", "rag", "react", "search_o1", "re2search", "reasonrag", "arena", "smartsearch"]
SEARCHING = ["react", "search_o1", "re2search", "reasonrag", "smartsearch"]

STATE = State("Who directed Il Coraggio?",
              [Step(Action("query", "Il Coraggio film"), docs=[Doc("d1", 1.0, "Il Coraggio", "A 1955 film by D. Paolella."),
                                                               Doc("d2", 0.5, "Coraggio", "An Italian word.")],
                    summary="Domenico Paolella")],
              references=(Doc("r1", 0.0, "Ref", "Reference text."),))


class Capture:
    """A tokenizer stand-in whose chat template records the messages."""

    def __init__(self):
        self.messages = None

    def chat(self, messages, add_generation_prompt=True):
        self.messages = messages
        return "<prompt>"


def messages(name, state, **opts):
    tok = Capture()
    get_agent(name, tokenizer=tok, **opts).render(state)
    return tok.messages


# The released templates (github:RAG-Gym/RAG-Gym, rag_gym/agents/react.py, direct.py, search_o1.py), typed in
# here independently of the package so a drifting copy fails.
REACT_SYSTEM = "You are a helpful assistant. Your task is to think step-by-step and take an action to help solve a given question."
REACT_USER = """### Information-seeking History
Query: Il Coraggio film
Document [0] (Title: Il Coraggio) A 1955 film by D. Paolella.
Document [1] (Title: Coraggio) An Italian word.

### Original Question
Who directed Il Coraggio?

Your output must include two sections:
1. **### Step-by-step Reasoning**:
  - Think step-by-step and reason about the current situation.
  - Take an action for the next step which can be two types:
    - Search[query], which searches the exact query in an external knowledge base. Avoid duplicating queries already asked in the history.
    - Finish[answer], which returns the answer and finishes the task.

2. **### Structured Output**:
  - If the next action is `Search`, present your generated query in the following JSON format:
    ```json
    {
        "generated_query": "Provide an entity, question, or statement to be searched in an external knowledge base.",
    }
    ```
  - If the next action is `Finish`, present your predicted answer in the following JSON format:
    ```json
    {
        "predicted_answer": "Provide a single letter (for multiple-choice questions), digit, word, or short phrase here."
    }
    ```"""
REACT_FINAL_USER = """### Information-seeking History
Query: Il Coraggio film
Answer: Domenico Paolella

### Original Question
Who directed Il Coraggio?

Your output must include two sections:
1. **### Step-by-step Reasoning**:
  - Think step-by-step and reason about the current situation.
  - Take an action for the next step which can be one type:
    - Finish[answer], which returns the answer and finishes the task.

2. **### Structured Output**:
  - Present your predicted answer in the following JSON format:
    ```json
    {
        "predicted_answer": "Provide a single letter (for multiple-choice questions), digit, word, or short phrase here."
    }
    ```"""
DIRECT_USER = """### Question
Which drug? {'A': 'Aspirin', 'B': 'Metformin'}

Directly present your predicted answer in the following JSON format:
```json
{
"predicted_answer": "Provide a single letter (for multiple-choice questions), digit, word, or short phrase here."
}
```"""
SUMMARY_USER = """### Relevant Documents
(Title: Il Coraggio) A 1955 film by D. Paolella.
(Title: Coraggio) An Italian word.

### Context
Original question:
Who directed Il Coraggio?

### Follow-up Query
Il Coraggio film

Answer the follow-up query succinctly, using only the information from the documents. When the documents do not provide sufficient information, explicitly point this out instead of making up facts. Do not include unrelated or excessive details in the response."""


def test_react_prompt_is_the_released_template():
    assert messages("react", STATE) == [{"role": "system", "content": REACT_SYSTEM},
                                        {"role": "user", "content": REACT_USER}]
    empty = messages("react", State("Who directed Il Coraggio?"))[1]["content"]
    assert empty.startswith("### Information-seeking History\n\n\n### Original Question\n")   # empty history: ""


def test_search_o1_last_step_is_the_released_truncated_template():
    final = State(STATE.question, STATE.history, must_answer=True)
    assert messages("search_o1", final) == [{"role": "system", "content": REACT_SYSTEM},
                                            {"role": "user", "content": REACT_FINAL_USER}]


def test_direct_prompt_and_the_released_multiple_choice_question():
    mc = State("Which drug?", choices=("Aspirin", "Metformin"))
    assert messages("direct", mc) == [
        {"role": "system", "content": "You are a helpful assistant. Your task is to answer a given question with no "
                                      "additional text or explanations."},
        {"role": "user", "content": DIRECT_USER}]


def test_summarizer_prompt_is_the_released_rag_module():
    tok = Capture()
    get_agent("re2search", tokenizer=tok).render_summary(STATE, "Il Coraggio film", STATE.history[0].docs)
    assert tok.messages == [{"role": "system", "content": "You are a helpful assistant tasked with answering a "
                                                          "follow-up query using the relevant documents provided."},
                            {"role": "user", "content": SUMMARY_USER}]


def test_cot_and_rag_sections():
    cot = messages("cot", STATE)[1]["content"]
    assert cot.startswith("### Question\nWho directed Il Coraggio?\n\nYour output must include two sections:")
    rag = messages("rag", STATE)
    assert rag[0]["content"].endswith("answer a given question using the provided relevant documents.")
    assert rag[1]["content"].startswith("### Relevant Documents\nDocument [0] (Title: Il Coraggio) A 1955 film by "
                                        "D. Paolella.\nDocument [1] (Title: Coraggio) An Italian word.\n\n### Question\n")


@pytest.mark.parametrize("name", ["react", "search_o1", "cot", "rag"])
def test_structured_output_round_trip_keeps_reasoning(name):
    agent = get_agent(name)
    a = Action("answer", "Domenico Paolella", "", {"reasoning": "The film is by Paolella."})
    text = agent.format(a)
    assert text == ('### Step-by-step Reasoning\nThe film is by Paolella.\n\n### Structured Output\n```json\n'
                    '{\n    "predicted_answer": "Domenico Paolella"\n}\n```')
    assert agent.parse(text) == a


# ---- the must-answer step ---------------------------------------------------------------------------------
def _final(state):
    return State(state.question, state.history, state.choices, state.references, must_answer=True)


@pytest.mark.parametrize("name", AGENTS)
def test_last_step_prompt_says_answer_now(name):
    normal, final = get_agent(name).render(STATE), get_agent(name).render(_final(STATE))
    if name not in SEARCHING:            # Direct, CoT, RAG, ARENA always answer in their one generation
        assert final == normal
        return
    assert final != normal
    if name in ("react", "search_o1", "re2search"):
        assert '"generated_query"' in normal and '"generated_query"' not in final and '"predicted_answer"' in final
    if name == "re2search":
        assert "Unverified Claim Identification" in normal and "Unverified Claim Identification" not in final
    if name == "reasonrag":
        assert final.startswith("You are a reasoning assistant with retrieval. Give a precise and very concise final "
                                "answer for the given question, conclude with 'So the answer is <answer>short "
                                "answer</answer>'.")
        assert final.endswith("<evidence>Domenico Paolella</evidence> ")       # the transcript continues
    if name == "smartsearch":
        assert base.MUST_ANSWER_NOTE in final and base.MUST_ANSWER_NOTE not in normal
    # off: the prompt stays as on every other step; plain prompts never change
    assert get_agent(name, must_answer_prompt=False).render(_final(STATE)) == normal
    assert get_agent(name, mode="plain").render(_final(STATE)) == get_agent(name, mode="plain").render(STATE)


def test_engine_asks_for_the_final_answer_on_the_last_step():
    passages = [Passage(f"p{i}", f"T{i}", f"fact {i}") for i in range(5)]
    pol = ScriptedPolicy(lambda p, j: '{"generated_query": "fact"}')
    ep = rollout(pol, OverlapRetriever(passages), get_agent("react"),
                 [{"id": "q", "question": "Which fact?", "golden_answers": ["x"]}], RolloutConfig(k=2, max_steps=3))[0]
    prompts = [c["prompts"][0] for c in pol.calls]
    assert ["can be two types" in p for p in prompts] == [True, True, False]
    assert "which can be one type:\n    - Finish[answer]" in prompts[2]
    assert ep.done == "max_steps" and ep.answer is None      # a query on the last step is not executed as an answer


def test_rag_answers_without_search_when_its_first_step_is_the_last():
    rag = get_agent("rag")
    assert rag.first_action(State("Q?")).kind == "query"
    assert rag.first_action(State("Q?", must_answer=True)) is None


# ---- documents ---------------------------------------------------------------------------------------------
def test_document_cut_is_a_field_and_none_means_whole():
    long = State("Q?", [Step(Action("query", "q"), docs=[Doc("d", 1.0, "T", "word " * 400)])])
    cut = get_agent("react", max_doc_chars=50).render(long)
    assert "Document [0] (Title: T) " + ("word " * 10).strip() + " ..." in cut
    assert ("word " * 400).strip() in get_agent("react", max_doc_chars=None).render(long)
    assert ("word " * 400).strip() not in get_agent("react").render(long)      # default: 1,000 characters
