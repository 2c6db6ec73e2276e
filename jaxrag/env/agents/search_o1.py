"""Search-o1 (as in RAG-Gym): ReAct whose history holds (query, summary) pairs; a summarizer prompt
(RAG-Gym App. H Fig. 8) turns each query's documents into a short answer to that query."""
import dataclasses
import re
from typing import Sequence

from jaxrag.env.agents import base
from jaxrag.env.agents.react import ReAct
from jaxrag.env.mdp import Doc, State
from jaxrag.env.parsing import canon, find_marker, strip_fences

SUMMARY_SYSTEM = ("You are a helpful assistant tasked with answering a follow-up query using the relevant "
                  "documents provided.")
SUMMARY_USER = ("Relevant Documents\n{documents}\n\nContext\nOriginal question: {question}\n\n"
                "Follow-up Query\n{query}\n\nAnswer the follow-up query succinctly, using only the "
                "information from the documents. When the documents do not provide sufficient information, "
                "explicitly point this out instead of making up facts. Do not include unrelated or excessive "
                "details in the response.")


@dataclasses.dataclass
class Summarizing:
    """Mixin: summary prompt (Fig. 8) and its lenient parser."""

    def render_summary(self, state: State, query: str, docs: Sequence[Doc]) -> str:
        if self.mode == "plain":
            return (base.plain_question(state) + f"search: {canon(query)}\n" + base.plain_docs(docs, self))
        user = SUMMARY_USER.format(documents=self.docs_block(docs) or "(no documents)",
                                   question=base.question_block(state), query=query)
        return self.chat(SUMMARY_SYSTEM, user)

    def parse_summary(self, text: str) -> str | None:
        text = strip_fences(text or "")
        if self.mode == "plain":
            hit = find_marker(text, ("summary",))
            return hit[1] if hit else None
        text = re.sub(r"^\s*(?:#+\s*)?(?:\*\*)?(?:answer|summary)(?:\*\*)?\s*:\s*", "", text.strip(), flags=re.I)
        return canon(text) or None

    def format_summary(self, summary: str) -> str:
        return f"summary: {summary}" if self.mode == "plain" else summary

    @property
    def summary_stop(self) -> tuple[str, ...]:
        return base.PLAIN_STOP if self.mode == "plain" else ()


@dataclasses.dataclass
class SearchO1(Summarizing, ReAct):
    name = "search_o1"
    summarizes: bool = True

    def history_block(self, state: State) -> str:
        parts = [f"Query: {s.action.text}\nAnswer: {s.summary or 'No information found.'}" for s in state.searches]
        return "\n\n".join(parts) or "(empty)"

    def render_plain(self, state: State) -> str:
        return base.plain_question(state) + base.plain_history(state, self, summaries=self.summarizes)


AGENT = SearchO1
