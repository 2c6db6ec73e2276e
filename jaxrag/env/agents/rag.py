"""RAG: the first action is the question itself as the query; then answer from the documents."""
import dataclasses

from jaxrag.env.agents import base
from jaxrag.env.agents.direct import Direct
from jaxrag.env.mdp import QUERY, Action, State
from jaxrag.env.parsing import canon


@dataclasses.dataclass
class RAG(Direct):
    name = "rag"
    max_query_chars: int = 1000     # long questions (MedQA) are cut to this many characters as a query

    def first_action(self, state: State) -> Action | None:
        if state.searches:
            return None
        return Action(QUERY, canon(state.question)[:self.max_query_chars], "", {"scripted": True})

    def render_chat(self, state: State) -> str:
        docs = "\n".join(self.docs_block(s.docs) for s in state.searches) or "(none)"
        system = ("You are a helpful assistant. Answer the question using the relevant documents. "
                  "Think step by step, then end your response with one line 'Answer: <answer>', "
                  f"where <answer> is {base.answer_format(state)}.")
        return self.chat(system, f"Relevant Documents:\n{docs}\n\nQuestion: {base.question_block(state)}")

    def render_plain(self, state: State) -> str:
        return base.plain_question(state) + base.plain_history(state, self)


AGENT = RAG
