"""Direct: answer at once from parametric knowledge (RAG-Gym App. D)."""
import dataclasses

from jaxrag.env.agents import base
from jaxrag.env.mdp import QUERY, Action, State


@dataclasses.dataclass
class Direct(base.Agent):
    name = "direct"
    instruction = "Answer the question directly, without explanation."

    def render_chat(self, state: State) -> str:
        system = (f"You are a helpful assistant. {self.instruction} End your response with one line "
                  f"'Answer: <answer>', where <answer> is {base.answer_format(state)}.")
        return self.chat(system, f"Question: {base.question_block(state)}")

    def parse_chat(self, text: str) -> Action:
        return base.parse_marked(text, allow_query=False)

    def format_chat(self, action: Action) -> str:
        return base.format_marked(action)

    def render_plain(self, state: State) -> str:
        return base.plain_question(state)

    def parse_plain(self, text: str) -> Action:
        act = base.parse_plain_line(text)
        return Action.invalid(text, f"{self.name} cannot search") if act.kind == QUERY else act


AGENT = Direct
