"""CoT: step-by-step reasoning, then the answer, in one generation (RAG-Gym App. D)."""
import dataclasses

from jaxrag.env.agents.direct import Direct


@dataclasses.dataclass
class CoT(Direct):
    name = "cot"
    instruction = "Think step by step about the question, then give the final answer."


AGENT = CoT
