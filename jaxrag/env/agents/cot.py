"""CoT: step-by-step reasoning, then the answer as JSON, in one generation (RAG-Gym; released
rag_gym/agents/cot.py, see _rag_gym.py)."""
import dataclasses

from jaxrag.env.agents import _rag_gym as rg
from jaxrag.env.agents.direct import Direct


@dataclasses.dataclass
class CoT(Direct):
    name = "cot"
    system = rg.COT_SYSTEM
    user = rg.COT_USER


AGENT = CoT
