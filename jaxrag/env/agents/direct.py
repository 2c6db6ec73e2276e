"""Direct: answer at once from parametric knowledge (RAG-Gym; prompt and JSON output of the released
rag_gym/agents/direct.py, see _rag_gym.py). Plain mode: `question: ...` -> `answer: ...`."""
import dataclasses

from jaxrag.env.agents import _rag_gym as rg
from jaxrag.env.agents import base
from jaxrag.env.mdp import QUERY, Action, State


@dataclasses.dataclass
class Direct(base.Agent):
    """Answers in one generation, so every step is already a must-answer step: no last-step variant."""
    name = "direct"
    system = rg.DIRECT_SYSTEM
    user = rg.DIRECT_USER

    def render_chat(self, state: State) -> str:
        return self.chat(self.system, rg.fill(self.user, question=rg.question(state)))

    def parse_chat(self, text: str) -> Action:
        return rg.parse(text, allow_query=False)

    def format_chat(self, action: Action) -> str:
        return rg.format_output(action)

    def render_plain(self, state: State) -> str:
        return base.plain_question(state)

    def parse_plain(self, text: str) -> Action:
        act = base.parse_plain_line(text)
        return Action.invalid(text, f"{self.name} cannot search") if act.kind == QUERY else act


AGENT = Direct
