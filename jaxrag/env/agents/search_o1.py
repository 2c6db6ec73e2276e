"""Search-o1 (as in RAG-Gym): ReAct whose history holds (query, summary) pairs; a summarizer prompt
(App. H Fig. 8; released RAGModule in rag_gym/agents/search_o1.py) turns each query's documents into a short
answer to that query. Prompts and output as ReAct's (the released search_o1.py holds identical copies)."""
import dataclasses
import re
from typing import Sequence

from jaxrag.env.agents import _rag_gym as rg
from jaxrag.env.agents import base
from jaxrag.env.agents.react import ReAct
from jaxrag.env.mdp import Doc, State
from jaxrag.env.parsing import canon, find_marker, strip_fences


@dataclasses.dataclass
class Summarizing:
    """Mixin: the summary prompt (Fig. 8 / RAGModule) and its lenient parser."""

    def summary_prompt(self, state: State, query: str, docs: Sequence[Doc]) -> str:
        if self.mode == "plain":
            return (base.plain_question(state) + f"search: {canon(query)}\n" + base.plain_docs(docs, self))
        return self.chat(rg.SUMMARY_SYSTEM, rg.summary_user(state, query, self.shown(docs), self.clip))

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
        if not self.summarizes:
            return super().history_block(state)
        return rg.history_with_summaries(state)

    def render_plain(self, state: State) -> str:
        return base.plain_question(state) + base.plain_history(state, self, summaries=self.summarizes)


AGENT = SearchO1
