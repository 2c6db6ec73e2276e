"""The one judge protocol of process supervision: given states and candidates, return scores, or a recorded failure.

Every judge (OpenAI-compatible HTTP, local JAX model through the sampler, the synthetic world's oracle) implements
`Judge.judge(requests) -> results`, batched. A failed item is never dropped or raised: its JudgeResult has
`scores=None` and `failure` says why (HTTP status, timeout, refused connection, unparseable reply text), with the
number of attempts and seconds spent, so every table built on judge output can say how many items failed.

Request kinds (each paper's prompt):
  "rank"        RAG-Gym App. H Fig. 10: rank the candidate actions at the state (sufficiency/utility/redundancy);
                scores = 1/(1+rank), ranks 0 = best.
  "step_score"  ReasonRAG Fig. 14: score one intermediate step (a candidate) in [0, 1].
  "usefulness"  SmartSearch App. A: is each candidate query useful given question, gold answer and trajectory; {0,1}.
  "refine"      SmartSearch App. A: rewrite a bad query; the new query text goes in `texts`.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence

from jaxrag.env.mdp import Action, State

KINDS = ("rank", "step_score", "usefulness", "refine")


@dataclasses.dataclass
class JudgeRequest:
    kind: str
    state: State  # question + executed history
    candidates: list[Action]  # the actions to judge (raw text in Action.raw)
    gold: list[str] = dataclasses.field(default_factory=list)  # judges that may see the answer (usefulness)
    metadata: dict = dataclasses.field(default_factory=dict)  # e.g. the synthetic gold chain for the oracle
    explanation: str = ""  # "refine": why the query was judged bad


@dataclasses.dataclass
class JudgeResult:
    scores: list[float] | None  # one per candidate; None = failed (see failure)
    ranks: list[int] | None = None  # "rank" requests: 0 = best
    texts: list[str] | None = None  # "refine": rewritten queries
    rationale: str = ""
    failure: str = ""  # "" when it worked
    attempts: int = 1
    seconds: float = 0.0
    reply: str = ""  # the raw reply text (kept for failures)

    @property
    def ok(self) -> bool:
        return self.scores is not None and not self.failure


class Judge(Protocol):
    name: str

    def judge(self, requests: Sequence[JudgeRequest]) -> list[JudgeResult]: ...
