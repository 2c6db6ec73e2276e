"""Re²Search (RAG-Gym App. H Fig. 9): reason to an answer, reflect on unverified claims, query for the
first missing piece. Output JSON {"predicted_answer", "generated_query"}; a 'None' query means answer.
History: (query, summary) pairs from the Fig. 8 summarizer (chat default) or raw documents (plain default)."""
import dataclasses
import json
import re

from jaxrag.env.agents import base
from jaxrag.env.agents.search_o1 import Summarizing
from jaxrag.env.mdp import ANSWER, INVALID, QUERY, Action, State
from jaxrag.env.parsing import canon, json_field, loads_lenient

SYSTEM = "You are a helpful assistant. Your task is to answer a given question following user instructions."
USER = """### Information-seeking History
{history}

### Original Question
{question}

Your output must include three sections:
1. **### Step-by-step Reasoning**:
- Think step-by-step and then answer the question.

2. **### Unverified Claim Identification**:
- Identify if there are claims in the step-by-step reasoning section that are not grounded in the information-seeking history section.
- If yes, summarize the first piece of missing information as an atomic query to search in an external knowledge base.
- If no, clearly state that no further query is needed.

3. **### Structured Output**:
- Present your predicted answer and generated query (if applicable) in the following JSON format:
```json
{{
    "predicted_answer": "Provide a single letter (for multiple-choice questions), digit, word, or short phrase here.",
    "generated_query": "Provide an entity, question, or statement to be searched in an external knowledge base. Output \\"None\\" if no query is generated.",
}}
```"""
_NO_QUERY = {"", "none", "null", "n/a", "no query", "no query needed", "no further query is needed"}
_SECTION = r"#+\s*\**\s*{title}\s*\**\s*:?\s*\**\s*\n(.*?)(?=\n\s*#+\s|\n\s*```|\Z)"


def _section(text: str, title: str) -> str:
    m = re.search(_SECTION.format(title=title), text, re.S | re.I)
    return canon(m.group(1)) if m else ""


@dataclasses.dataclass
class Re2Search(Summarizing, base.Agent):
    name = "re2search"
    summarizes: bool | None = None     # None: summaries in chat mode, raw documents in plain mode

    def __post_init__(self):
        super().__post_init__()
        if self.summarizes is None:
            self.summarizes = self.mode == "chat"

    def history_block(self, state: State) -> str:
        if self.summarizes:
            parts = [f"Query: {s.action.text}\nAnswer: {s.summary or 'No information found.'}" for s in state.searches]
        else:
            parts = [f"Query: {s.action.text}\nDocuments:\n{self.docs_block(s.docs) or '(no documents)'}"
                     for s in state.searches]
        return "\n\n".join(parts) or "(empty)"

    def render_chat(self, state: State) -> str:
        return self.chat(SYSTEM, USER.format(history=self.history_block(state), question=base.question_block(state)))

    def parse_chat(self, text: str) -> Action:
        obj = loads_lenient(text) or {}
        obj = {str(k).lower().strip(): v for k, v in obj.items()}
        pa, gq = obj.get("predicted_answer"), obj.get("generated_query")
        if pa is None:
            pa = json_field(text, "predicted_answer")
        if gq is None:
            gq = json_field(text, "generated_query")
        pa = canon(pa) if pa is not None else ""
        gq = canon(gq) if gq is not None else ""
        if pa == "None":
            pa = ""
        extra = {k: v for k, v in (("reasoning", _section(text, "Step-by-step Reasoning")),
                                   ("claims", _section(text, "Unverified Claim Identification"))) if v}
        if gq.lower().rstrip(".") not in _NO_QUERY:
            if pa:
                extra["predicted_answer"] = pa
            return Action(QUERY, gq, text, extra)
        if pa:
            return Action(ANSWER, pa, text, extra)
        return Action.invalid(text, "no predicted_answer and no generated_query")

    def format_chat(self, action: Action) -> str:
        if action.kind == INVALID:
            return action.raw
        if action.kind == QUERY:
            out = {"predicted_answer": action.extra.get("predicted_answer", ""), "generated_query": action.text}
        else:
            out = {"predicted_answer": action.text, "generated_query": "None"}
        parts = []
        if action.extra.get("reasoning"):
            parts.append(f"### Step-by-step Reasoning\n{action.extra['reasoning']}")
        if action.extra.get("claims"):
            parts.append(f"### Unverified Claim Identification\n{action.extra['claims']}")
        parts.append("### Structured Output\n```json\n" + json.dumps(out, ensure_ascii=False, indent=4) + "\n```")
        return "\n\n".join(parts)

    # plain: `guess: P ; search: Q` or `answer: A`
    def render_plain(self, state: State) -> str:
        return base.plain_question(state) + base.plain_history(state, self, summaries=self.summarizes)

    def parse_plain(self, text: str) -> Action:
        line = next((ln for ln in text.splitlines() if ln.strip()), "")
        m = re.match(r"^\s*(?:guess\s*:\s*(.*?)\s*;\s*)?search\s*:\s*(.*)$", line, re.I)
        if m and canon(m.group(2)):
            guess = canon(m.group(1) or "")
            return Action(QUERY, canon(m.group(2)), text, {"predicted_answer": guess} if guess else {})
        act = base.parse_plain_line(text)
        return act

    def format_plain(self, action: Action) -> str:
        if action.kind == QUERY and action.extra.get("predicted_answer"):
            return f"guess: {action.extra['predicted_answer']} ; search: {action.text}"
        return base.format_plain_line(action)


AGENT = Re2Search
