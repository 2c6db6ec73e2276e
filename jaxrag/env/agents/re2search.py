"""Re²Search (RAG-Gym 001 App. H Fig. 9, verbatim): reason to an answer, reflect on unverified claims, query for
the first missing piece. Output JSON {"predicted_answer", "generated_query"}; a 'None' query means answer.
History: (query, summary) pairs from the Fig. 8 summarizer (chat default) or raw documents (plain default), in
the released code's layout (see _rag_gym.py; the released ReSearch template differs from Fig. 9 in a few words)."""
import dataclasses
import json
import re

from jaxrag.env.agents import _rag_gym as rg
from jaxrag.env.agents import base
from jaxrag.env.agents.search_o1 import Summarizing
from jaxrag.env.mdp import ANSWER, INVALID, QUERY, Action, State
from jaxrag.env.parsing import canon

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
# The last allowed step. The released code keeps Fig. 9 there and the environment takes the predicted answer;
# jaxrag (must_answer_prompt=True, the default) says it in the prompt, the way the released code derives ReAct's
# `truncated` template from its own: the search option (here: section 2 and the query field) removed.
USER_FINAL = """### Information-seeking History
{history}

### Original Question
{question}

Your output must include two sections:
1. **### Step-by-step Reasoning**:
- Think step-by-step and then answer the question.

2. **### Structured Output**:
- Present your predicted answer in the following JSON format:
```json
{{
    "predicted_answer": "Provide a single letter (for multiple-choice questions), digit, word, or short phrase here.",
}}
```"""


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
            return rg.history_with_summaries(state)
        return rg.history_with_documents(state, self.shown, self.clip)

    def render_chat(self, state: State) -> str:
        user = USER_FINAL if self.must_answer_now(state) else USER
        return self.chat(SYSTEM, user.format(history=self.history_block(state), question=rg.question(state)))

    def parse_chat(self, text: str) -> Action:
        pa, gq = rg.structured_fields(text)
        extra = {k: v for k, v in (("reasoning", rg.section(text, "Step-by-step Reasoning")),
                                   ("claims", rg.section(text, "Unverified Claim Identification"))) if v}
        if gq:
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
