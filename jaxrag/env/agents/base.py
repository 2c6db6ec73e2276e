"""What every agent design shares: chat/plain rendering helpers and the safe-parse wrapper.

An agent is `render(state) -> prompt`, `parse(text) -> Action` (never raises), `format(action) -> text`
(the inverse of parse on canonical actions) and `stop` strings. Agents that post-process retrieved
documents with a second generation (Search-o1/Re²Search summaries, ReasonRAG grounding) also define
`render_summary / parse_summary / format_summary / summary_stop` and set `summarizes = True`.

Two rendering modes: "chat" (the papers' prompts, through `tokenizer.chat` for instruct checkpoints)
and "plain" (short line-based prompts for the synthetic world: `question: ...`, `search: ...`,
`doc: title: text`, the action as one line `search: ...` / `answer: ...`).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar, Sequence

from jaxrag.env.mdp import ANSWER, INVALID, QUERY, Action, Doc, State
from jaxrag.env.parsing import canon, find_marker, loads_lenient, strip_fences
from jaxrag.metrics import LETTERS

PLAIN_STOP = ("\n",)


@dataclasses.dataclass
class Agent:
    name: ClassVar[str] = "base"
    uses_references: ClassVar[bool] = False   # ARENA: the dataset's paragraphs are the documents
    mode: str = "chat"                        # "chat" | "plain"
    tokenizer: Any = None                     # anything with .chat(messages) -> str; None: plain join
    max_docs: int | None = None               # docs shown per search (None: all retrieved)
    max_doc_chars: int = 1000
    summarizes: bool = False

    def __post_init__(self):
        if self.mode not in ("chat", "plain"):
            raise ValueError(f"{self.name}: mode must be 'chat' or 'plain', got {self.mode!r}")

    # ---- the protocol ------------------------------------------------------------------------------
    def render(self, state: State) -> str:
        return self.render_plain(state) if self.mode == "plain" else self.render_chat(state)

    def parse(self, text: str) -> Action:
        """Parse a generation into one macro-action; anything unparseable is Invalid (never raises)."""
        try:
            text = "" if text is None else str(text)
            act = self.parse_plain(text) if self.mode == "plain" else self.parse_chat(text)
        except Exception as e:  # a parser bug must not kill a rollout: record it
            return Action.invalid(str(text), f"parser error: {type(e).__name__}: {e}")
        return dataclasses.replace(act, raw=text)

    def format(self, action: Action) -> str:
        return self.format_plain(action) if self.mode == "plain" else self.format_chat(action)

    @property
    def stop(self) -> tuple[str, ...]:
        return PLAIN_STOP if self.mode == "plain" else self.chat_stop

    chat_stop: ClassVar[tuple[str, ...]] = ()

    @property
    def summary_stop(self) -> tuple[str, ...]:
        return PLAIN_STOP if self.mode == "plain" else ()

    def first_action(self, state: State) -> Action | None:
        """An action taken without generation (RAG's first query); None: ask the policy."""
        return None

    # ---- per-design hooks ----------------------------------------------------------------------------
    def render_chat(self, state: State) -> str:
        raise NotImplementedError

    def parse_chat(self, text: str) -> Action:
        raise NotImplementedError

    def format_chat(self, action: Action) -> str:
        raise NotImplementedError

    def render_plain(self, state: State) -> str:
        return plain_question(state) + plain_history(state, self)

    def parse_plain(self, text: str) -> Action:
        return parse_plain_line(text)

    def format_plain(self, action: Action) -> str:
        return format_plain_line(action)

    # ---- helpers -------------------------------------------------------------------------------------
    def chat(self, system: str, user: str, prefix: str = "") -> str:
        """system + user message through the tokenizer's chat template, then the assistant `prefix`."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        if self.tokenizer is not None and hasattr(self.tokenizer, "chat"):
            return self.tokenizer.chat(messages) + prefix
        return f"{system}\n\n{user}\n\n" + prefix

    def shown(self, docs: Sequence[Doc]) -> list[Doc]:
        return list(docs if self.max_docs is None else docs[:self.max_docs])

    def clip(self, text: str) -> str:
        text = canon(text)
        return text if len(text) <= self.max_doc_chars else text[:self.max_doc_chars].rstrip() + " ..."

    def docs_block(self, docs: Sequence[Doc], start: int = 1) -> str:
        return "\n".join(f"Document [{i}] (Title: {d.title}) {self.clip(d.text)}"
                         for i, d in enumerate(self.shown(docs), start))


# ---- shared rendering pieces ---------------------------------------------------------------------------
def options_block(choices: Sequence[str], sep: str = "\n") -> str:
    return sep.join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))


def question_block(state: State) -> str:
    """The question (with its options for multiple choice) as the papers' prompts show it."""
    if not state.choices:
        return state.question
    return f"{state.question}\nOptions:\n{options_block(state.choices)}"


def answer_format(state: State) -> str:
    return ("a single option letter (A, B, C or D)" if state.choices
            else "a single word, number or short phrase")


def plain_question(state: State) -> str:
    s = f"question: {canon(state.question)}\n"
    if state.choices:
        s += f"options: {options_block([canon(c) for c in state.choices], ' ')}\n"
    return s


def plain_docs(docs: Sequence[Doc], agent: Agent) -> str:
    return "".join(f"doc: {canon(d.title)}: {agent.clip(d.text)}\n" for d in agent.shown(docs))


def plain_history(state: State, agent: Agent, summaries: bool = False, summary_tag: str = "summary") -> str:
    """`search: q` then its docs (or its summary line), for every executed search."""
    out = []
    for step in state.searches:
        out.append(agent.format_plain(step.action) + "\n")
        if summaries:
            out.append(f"{summary_tag}: {canon(step.summary or 'None')}\n")
        else:
            out.append(plain_docs(step.docs, agent))
    return "".join(out)


_PLAIN_LINE = re.compile(r"^\s*(search|answer)\s*:\s*(.*)$", re.I)


def parse_plain_line(text: str) -> Action:
    """First non-empty line must be `search: q` or `answer: a`."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    m = _PLAIN_LINE.match(line)
    if m is None or not canon(m.group(2)):
        return Action.invalid(text, "expected 'search: ...' or 'answer: ...' on the first line")
    kind = QUERY if m.group(1).lower() == "search" else ANSWER
    return Action(kind, canon(m.group(2)), text)


def format_plain_line(action: Action) -> str:
    if action.kind == INVALID:
        return action.raw
    return f"{'search' if action.kind == QUERY else 'answer'}: {action.text}"


# ---- the "Query: ... / Answer: ..." convention of the RAG-Gym baselines ---------------------------------
_MARKERS = ("query", "search query", "search", "answer", "final answer")


def parse_marked(text: str, allow_query: bool = True) -> Action:
    """Reasoning text then a last line `Query: ...` or `Answer: ...`; JSON {"query"|"answer": ...} also works."""
    body = strip_fences(text)
    hit = find_marker(body, _MARKERS if allow_query else ("answer", "final answer"))
    if hit is None:
        obj = loads_lenient(text) or {}
        lowered = {str(k).lower(): v for k, v in obj.items()}
        q, a = lowered.get("query"), lowered.get("answer", lowered.get("predicted_answer"))
        if allow_query and q is not None and canon(str(q)) and canon(str(q)).lower() != "none":
            return Action(QUERY, canon(str(q)), text)
        if a is not None and canon(str(a)):
            return Action(ANSWER, canon(str(a)), text)
        return Action.invalid(text, "no 'Query:' or 'Answer:' line")
    name, value = hit
    kind = ANSWER if "answer" in name else QUERY
    # reasoning: everything before the last marker line
    last = None
    for m in re.finditer(r"^.*$", body, re.M):
        if find_marker(m.group(0), (name,)) is not None:
            last = m
    reasoning = canon(body[:last.start()]) if last is not None else ""
    return Action(kind, value, text, {"reasoning": reasoning} if reasoning else {})


def format_marked(action: Action) -> str:
    if action.kind == INVALID:
        return action.raw
    line = f"{'Query' if action.kind == QUERY else 'Answer'}: {action.text}"
    reasoning = action.extra.get("reasoning", "")
    return f"{reasoning}\n\n{line}" if reasoning else line
