"""RAG: the first action is the question itself as the query; then reason and answer from its documents
(RAG-Gym; released rag_gym/agents/rag.py, see _rag_gym.py)."""
import dataclasses

from jaxrag.env.agents import _rag_gym as rg
from jaxrag.env.agents import base
from jaxrag.env.agents.direct import Direct
from jaxrag.env.mdp import QUERY, Action, State
from jaxrag.env.parsing import canon


@dataclasses.dataclass
class RAG(Direct):
    """Its generated step always answers, so no last-step variant; on a must-answer first step (max_steps 1)
    it skips the scripted search and answers without documents."""
    name = "rag"
    system = rg.RAG_SYSTEM
    user = rg.RAG_USER
    max_query_chars: int = 1000     # long questions (MedQA) are cut to this many characters as a query

    def first_action(self, state: State) -> Action | None:
        if state.searches or state.must_answer:
            return None
        return Action(QUERY, canon(state.question)[:self.max_query_chars], "", {"scripted": True})

    def render_chat(self, state: State) -> str:
        docs = "\n".join(rg.documents(self.shown(s.docs), self.clip) for s in state.searches)
        return self.chat(self.system, rg.fill(self.user, documents=docs, question=rg.question(state)))

    def render_plain(self, state: State) -> str:
        return base.plain_question(state) + base.plain_history(state, self)

    def shorter_views(self, state: State) -> list[State]:
        """Over budget: drop the lowest-ranked documents first (its one search is its whole history)."""
        return base.fewer_documents(state)


AGENT = RAG
