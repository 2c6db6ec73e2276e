"""ReAct: reason, then either search or answer, every step (RAG-Gym; released rag_gym/agents/react.py,
see _rag_gym.py). On the last allowed step the released `truncated` template offers Finish only."""
import dataclasses

from jaxrag.env.agents import _rag_gym as rg
from jaxrag.env.agents import base
from jaxrag.env.mdp import Action, State


@dataclasses.dataclass
class ReAct(base.Agent):
    name = "react"

    def history_block(self, state: State) -> str:
        return rg.history_with_documents(state, self.shown, self.clip)

    def render_chat(self, state: State) -> str:
        user = rg.REACT_FINAL_USER if self.must_answer_now(state) else rg.REACT_USER
        return self.chat(rg.REACT_SYSTEM, rg.fill(user, history=self.history_block(state), question=rg.question(state)))

    def parse_chat(self, text: str) -> Action:
        return rg.parse(text, allow_query=True)

    def format_chat(self, action: Action) -> str:
        return rg.format_output(action)


AGENT = ReAct
