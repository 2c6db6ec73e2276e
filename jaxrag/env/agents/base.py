"""What every agent design shares: chat/plain rendering helpers and the safe-parse wrapper.

An agent is `render(state, fits=None) -> prompt`, `parse(text) -> Action` (never raises),
`format(action) -> text` (the inverse of parse on canonical actions) and `stop` strings. Agents that
post-process retrieved documents with a second generation (Search-o1/Re²Search summaries, ReasonRAG grounding)
also define `summary_prompt / parse_summary / format_summary / summary_stop` and set `summarizes = True`;
callers render summary prompts with `render_summary(state, query, docs, fits=None)`.

Two rendering modes: "chat" (the papers' prompts, through `tokenizer.chat` for instruct checkpoints)
and "plain" (short line-based prompts for the synthetic world: `question: ...`, `search: ...`,
`doc: title: text`, the action as one line `search: ...` / `answer: ...`).

Over-long prompts (one rule for every design): `render(state, fits)` takes the policy's budget test
(`fits(prompt) -> bool`, e.g. `JaxPolicy.prompt_fits`); when the full prompt does not fit, the agent renders
`shorter_views(state)` (default: whole searches dropped oldest first down to the most recent one, then that
search's lowest-ranked documents, then no history) and keeps the longest that fits, found by bisection. The
question is never dropped. Each agent counts what it did in `prompt_cuts` ("shortened": a shorter view fitted;
"over_budget": even the shortest did not, the policy then cuts tokens) and warns once per kind, not per prompt.
Summary prompts follow the same rule over the query's documents (`render_summary(..., fits)`).

The must-answer step (`state.must_answer`, set by the engine on the last allowed step): in chat mode each design
whose generation may search says there that it must answer now (`must_answer_prompt`, default True): ReAct and
Search-o1 with RAG-Gym's released `truncated` template, ReasonRAG with its released answer-generation prompt,
Re²Search and SmartSearch (no released variant) with jaxrag's wording. Direct, CoT, RAG and ARENA answer in
their one generation anyway. Plain prompts never change at that step: the synthetic policy is trained without
such a marker, and the engine still takes Re²Search's predicted answer there.

Documents: `max_doc_chars` cuts each shown document (1,000 characters by default; None: no cut, which is every
paper's setting: RAG-Gym, ReasonRAG, SmartSearch and ARENA feed whole retrieval units (wiki-18 100-word passages,
MedRAG snippets, the datasets' own paragraphs) in their released code).
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import re
from typing import Any, Callable, ClassVar, Sequence

from jaxrag.env.mdp import ANSWER, INVALID, QUERY, Action, Doc, Episode, State
from jaxrag.env.parsing import canon
from jaxrag.metrics import LETTERS

log = logging.getLogger(__name__)

PLAIN_STOP = ("\n",)
# jaxrag's own last-step line, for designs whose released code has no last-step prompt (SmartSearch)
MUST_ANSWER_NOTE = "This is the last step: no more searches are possible. Give your final answer now."
Fits = Callable[[str], bool]
_CUT_MESSAGES = {
    "shortened": "a prompt over the policy's token budget was rendered with its oldest searches / lowest-ranked "
                 "documents dropped (the question kept)",
    "over_budget": "a prompt stays over the policy's token budget even without history; the policy cuts its tokens",
}


@dataclasses.dataclass
class Agent:
    name: ClassVar[str] = "base"
    uses_references: ClassVar[bool] = False   # ARENA: the dataset's paragraphs are the documents
    mode: str = "chat"                        # "chat" | "plain"
    tokenizer: Any = None                     # anything with .chat(messages) -> str; None: plain join
    max_docs: int | None = None               # docs shown per search (None: all retrieved)
    max_doc_chars: int | None = 1000          # per-document character cut (None: none, the papers' setting)
    summarizes: bool = False
    must_answer_prompt: bool = True           # chat: the last allowed step's prompt says "answer now"
    prompt_cuts: collections.Counter = dataclasses.field(default_factory=collections.Counter, init=False,
                                                         repr=False, compare=False)

    def __post_init__(self):
        if self.mode not in ("chat", "plain"):
            raise ValueError(f"{self.name}: mode must be 'chat' or 'plain', got {self.mode!r}")

    # ---- the protocol ------------------------------------------------------------------------------
    def render(self, state: State, fits: Fits | None = None) -> str:
        """The prompt for `state`; with `fits`, the longest of `shorter_views(state)` whose prompt fits."""
        views = [state]
        if fits is not None:
            views += self.shorter_views(state)
        return self.fit(lambda i: self._render(views[i]), len(views), fits)

    def _render(self, state: State) -> str:
        return self.render_plain(state) if self.mode == "plain" else self.render_chat(state)

    def render_summary(self, state: State, query: str, docs: Sequence[Doc], fits: Fits | None = None) -> str:
        """The summary / grounding prompt for one query; with `fits`, its lowest-ranked documents are dropped
        until it fits. Designs define `summary_prompt(state, query, docs)`."""
        docs = list(docs)
        return self.fit(lambda i: self.summary_prompt(state, query, docs[:len(docs) - i]),
                        len(docs) + 1 if fits is not None else 1, fits)

    def summary_prompt(self, state: State, query: str, docs: Sequence[Doc]) -> str:
        raise NotImplementedError(f"{self.name} does not summarize")

    def fit(self, render: Callable[[int], str], n: int, fits: Fits | None) -> str:
        """render(0) if it fits (or no `fits`), else the first of render(1..n-1) that fits (they shrink as i
        grows, so bisection), else render(n-1). Counts and warns once per kind (see the module doc)."""
        first = render(0)
        if fits is None or fits(first):
            return first
        lo, hi, best = 1, n - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            p = render(mid)
            if fits(p):
                best, hi = p, mid - 1
            else:
                lo = mid + 1
        kind = "shortened" if best is not None else "over_budget"
        self.prompt_cuts[kind] += 1
        if self.prompt_cuts[kind] == 1:
            log.warning("%s: %s; further ones are only counted in agent.prompt_cuts[%r]", self.name,
                        _CUT_MESSAGES[kind], kind)
        return best if best is not None else (render(n - 1) if n > 1 else first)

    def shorter_views(self, state: State) -> list[State]:
        """Shorter and shorter views of `state` for an over-long prompt (the shared rule; the question stays):
        whole searches dropped oldest first down to the most recent one, then that search's documents from the
        lowest-ranked, then no history at all. Designs with another layout override it."""
        searches = state.searches
        views = [dataclasses.replace(state, history=searches[i:]) for i in range(1, len(searches))]
        return views + fewer_documents(dataclasses.replace(state, history=searches[-1:]) if searches else state)

    def must_answer_now(self, state: State) -> bool:
        """The last allowed step, and this agent says so in its prompt."""
        return bool(state.must_answer and self.must_answer_prompt)

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

    def scored_answer(self, episode: Episode) -> str | None:
        """The answer evaluation scores for an episode of this design (jaxrag.evaluate.episode_metrics): the
        executed answer action's text. Designs whose released evaluation reads the transcript otherwise override
        it (SmartSearch)."""
        return episode.answer

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
        if self.max_doc_chars is None or len(text) <= self.max_doc_chars:
            return text
        return text[:self.max_doc_chars].rstrip() + " ..."

    def docs_block(self, docs: Sequence[Doc], start: int = 1) -> str:
        return "\n".join(f"Document [{i}] (Title: {d.title}) {self.clip(d.text)}"
                         for i, d in enumerate(self.shown(docs), start))


# ---- shared rendering pieces ---------------------------------------------------------------------------
def fewer_documents(state: State) -> list[State]:
    """Views of `state` whose most recent search shows fewer documents (lowest-ranked dropped first, down to
    none), then the view without any history. [] when there is no search."""
    searches = state.searches
    if not searches:
        return []
    last = searches[-1]
    views = [dataclasses.replace(state, history=searches[:-1] + [dataclasses.replace(last, docs=last.docs[:d])])
             for d in range(len(last.docs) - 1, -1, -1)]
    return views + [dataclasses.replace(state, history=[])]


def options_block(choices: Sequence[str], sep: str = "\n") -> str:
    return sep.join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))


def question_block(state: State) -> str:
    """The question (with its options for multiple choice) as the papers' prompts show it."""
    if not state.choices:
        return state.question
    return f"{state.question}\nOptions:\n{options_block(state.choices)}"


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
