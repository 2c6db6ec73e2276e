"""ReAct: reason, then either search or answer, every step (RAG-Gym App. D)."""
import dataclasses

from jaxrag.env.agents import base
from jaxrag.env.mdp import Action, State


@dataclasses.dataclass
class ReAct(base.Agent):
    name = "react"

    def system_prompt(self, state: State) -> str:
        return ("You are a helpful assistant that answers a question by searching an external knowledge "
                "base. Reason step by step about the information-seeking history. If it is not yet "
                "sufficient, ask for the first missing piece of information with one search query; "
                "otherwise give the final answer. End your response with exactly one line, either\n"
                "Query: <search query>\nor\nAnswer: <answer>\n"
                f"where <answer> is {base.answer_format(state)}.")

    def history_block(self, state: State) -> str:
        parts = [f"Query: {s.action.text}\nDocuments:\n{self.docs_block(s.docs) or '(no documents)'}"
                 for s in state.searches]
        return "\n\n".join(parts) or "(empty)"

    def render_chat(self, state: State) -> str:
        user = (f"Information-seeking History:\n{self.history_block(state)}\n\n"
                f"Original Question:\n{base.question_block(state)}")
        return self.chat(self.system_prompt(state), user)

    def parse_chat(self, text: str) -> Action:
        return base.parse_marked(text)

    def format_chat(self, action: Action) -> str:
        return base.format_marked(action)


AGENT = ReAct
