"""The RAG-Gym agents' prompts and output format (001 App. H; the released code, github:RAG-Gym/RAG-Gym,
rag_gym/agents/{direct,cot,rag,react,search_o1,research}.py), verbatim.

Every RAG-Gym prompt is a system message plus a user template with `{{name}}` slots (Liquid in the released code).
The output is step-by-step reasoning then a structured JSON object: `predicted_answer` (Direct, CoT, RAG; ReAct
and Search-o1 when they finish) or `generated_query` (ReAct and Search-o1 when they search). Re²Search's own
template (Fig. 9) lives in re2search.py.

Released-code facts reproduced here: a multiple-choice question is `f"{question} {options}"` with the options
dict's Python repr (src/run_pipeline.py); documents are `Document [i] (Title: t) text` numbered from 0, the
history of ReAct is `Query: q` then its documents, blocks joined by a blank line, an empty history is the empty
string; the summarizer sees `(Title: t) text` lines and the context `Original question:\n{question}`.
"""
from __future__ import annotations

import json
import re
from typing import Sequence

from jaxrag.env.mdp import ANSWER, INVALID, QUERY, Action, State
from jaxrag.env.parsing import canon, json_field, loads_lenient
from jaxrag.metrics import LETTERS

DIRECT_SYSTEM = '''You are a helpful assistant. Your task is to answer a given question with no additional text or explanations.'''
DIRECT_USER = '''### Question
{{question}}

Directly present your predicted answer in the following JSON format:
```json
{
"predicted_answer": "Provide a single letter (for multiple-choice questions), digit, word, or short phrase here."
}
```'''

COT_SYSTEM = '''You are a helpful assistant. Your task is to think step-by-step and answer a given question.'''
COT_USER = '''### Question
{{question}}

Your output must include two sections:
1. **### Step-by-step Reasoning**:
  - Think step-by-step and then answer the question.

2. **### Structured Output**:
  - Present your predicted answer in the following JSON format:
  ```json
  {
    "predicted_answer": "Provide a single letter (for multiple-choice questions), digit, word, or short phrase here."
  }
  ```'''

RAG_SYSTEM = '''You are a helpful assistant. Your task is to think step-by-step and answer a given question using the provided relevant documents.'''
RAG_USER = '''### Relevant Documents
{{documents}}

### Question
{{question}}

Your output must include two sections:
1. **### Step-by-step Reasoning**:
  - Think step-by-step and then answer the question using the provided relevant documents.

2. **### Structured Output**:
  - Present your predicted answer in the following JSON format:
  ```json
  {
    "predicted_answer": "Provide a single letter (for multiple-choice questions), digit, word, or short phrase here."
  }
  ```'''

# ReAct and Search-o1 share these three (react.py and search_o1.py hold identical copies)
REACT_SYSTEM = '''You are a helpful assistant. Your task is to think step-by-step and take an action to help solve a given question.'''
REACT_USER = '''### Information-seeking History
{{history}}

### Original Question
{{question}}

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
    ```'''

# the `state.truncated` (last allowed step) variant: Finish only
REACT_FINAL_USER = '''### Information-seeking History
{{history}}

### Original Question
{{question}}

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
    ```'''

# the summarizer ("RAGModule") of Search-o1 and ReSearch/Re²Search; App. H Fig. 8 prints the same text
SUMMARY_SYSTEM = '''You are a helpful assistant tasked with answering a follow-up query using the relevant documents provided.'''
SUMMARY_USER = '''### Relevant Documents
{{documents}}

### Context
{{context}}

### Follow-up Query
{{query}}

Answer the follow-up query succinctly, using only the information from the documents. When the documents do not provide sufficient information, explicitly point this out instead of making up facts. Do not include unrelated or excessive details in the response.'''


def fill(template: str, **values: str) -> str:
    """Substitute every `{{name}}` slot in one pass (a value holding `{{x}}` is never substituted again)."""
    return re.sub(r"\{\{(\w+)\}\}", lambda m: str(values[m.group(1)]), template)


def question(state: State) -> str:
    """The question as the released pipeline builds it: `f"{question} {options}"`, options a {letter: text} dict."""
    if not state.choices:
        return state.question
    return f"{state.question} {dict(zip(LETTERS, state.choices))}".strip()


# ---- the structured output ------------------------------------------------------------------------------
_NO_QUERY = {"", "none", "null", "n/a", "no query", "no query needed", "no further query is needed"}
_SECTION = r"#+\s*\**\s*{title}\s*\**\s*:?\s*\**\s*\n(.*?)(?=\n\s*#+\s|\n\s*```|\Z)"
_STRUCTURED = re.compile(r"#+\s*\**\s*Structured\s+Output", re.I)


def section(text: str, title: str) -> str:
    """The canonical text of a `### Title` section (up to the next header or code fence); "" if absent."""
    m = re.search(_SECTION.format(title=title), text, re.S | re.I)
    return canon(m.group(1)) if m else ""


def _value(v) -> str:
    if isinstance(v, (list, tuple)):
        v = v[0] if v else ""
    return "" if v is None else canon(str(v))


def structured_fields(text: str) -> tuple[str, str]:
    """(predicted_answer, generated_query) of the last JSON object after the last `### Structured Output` header
    (the whole text when there is none); lenient JSON (fences, trailing commas, single quotes, Python literals),
    then a per-key regex for broken JSON. Keys as the released parser: query | generated_query |
    generated_queries (a list: its first); predicted_answer (or answer). 'None'/null/'' mean absent."""
    heads = list(_STRUCTURED.finditer(text))
    part = text[heads[-1].end():] if heads else text
    obj = {str(k).lower().strip(): v for k, v in (loads_lenient(part) or {}).items()}
    pa = next((obj[k] for k in ("predicted_answer", "answer") if k in obj), None)
    gq = next((obj[k] for k in ("generated_query", "query", "generated_queries") if k in obj), None)
    if pa is None:
        pa = json_field(part, "predicted_answer")
    if gq is None:
        gq = json_field(part, "generated_query")
    pa, gq = _value(pa), _value(gq)
    pa = "" if pa.lower() in ("none", "null") else pa
    gq = "" if gq.lower().rstrip(".") in _NO_QUERY else gq
    return pa, gq


def parse(text: str, allow_query: bool) -> Action:
    """A RAG-Gym generation -> query (a generated_query, when the design can search) or answer
    (predicted_answer); the Step-by-step Reasoning section goes to extra["reasoning"]. Else Invalid."""
    pa, gq = structured_fields(text)
    reasoning = section(text, "Step-by-step Reasoning")
    extra = {"reasoning": reasoning} if reasoning else {}
    if gq and allow_query:
        return Action(QUERY, gq, text, extra)
    if pa:
        return Action(ANSWER, pa, text, extra)
    if gq:
        return Action.invalid(text, "a generated_query from a design that cannot search")
    return Action.invalid(text, "no predicted_answer or generated_query in a JSON object")


def format_output(action: Action, fields: dict | None = None) -> str:
    """The canonical generation for `action` (the inverse of `parse`): the reasoning section when the action
    has one, then `### Structured Output` and the JSON in a fence. `fields` overrides the JSON object."""
    if action.kind == INVALID:
        return action.raw
    if fields is None:
        fields = {"generated_query": action.text} if action.kind == QUERY else {"predicted_answer": action.text}
    parts = []
    if action.extra.get("reasoning"):
        parts.append(f"### Step-by-step Reasoning\n{action.extra['reasoning']}")
    parts.append("### Structured Output\n```json\n" + json.dumps(fields, ensure_ascii=False, indent=4) + "\n```")
    return "\n\n".join(parts)


# ---- history and documents ------------------------------------------------------------------------------
def documents(docs: Sequence, clip) -> str:
    """`Document [i] (Title: t) text` lines, i from 0 (rag.py / react.py)."""
    return "\n".join(f"Document [{i}] (Title: {d.title}) {clip(d.text)}" for i, d in enumerate(docs))


def history_with_documents(state: State, shown, clip) -> str:
    """ReAct's history (and Re²Search's without a summarizer): `Query: q` + its documents per search."""
    return "\n\n".join(f"Query: {s.action.text}\n" + documents(shown(s.docs), clip) for s in state.searches)


def history_with_summaries(state: State) -> str:
    """Search-o1's / Re²Search's history: `Query: q` + `Answer: <summary>` per search."""
    return "\n\n".join(f"Query: {s.action.text}\nAnswer: {s.summary if s.summary is not None else ''}"
                         for s in state.searches)


def summary_user(state: State, query: str, docs: Sequence, clip) -> str:
    """The summarizer's user message for one query and its documents."""
    return fill(SUMMARY_USER, documents="\n".join(f"(Title: {d.title}) {clip(d.text)}" for d in docs),
                context=f"Original question:\n{question(state)}", query=query)
