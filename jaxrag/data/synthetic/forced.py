"""A Policy wrapper that makes the model answer now: the prompt ends with the agent's answer prefix and the
completion is returned with it. Used for the no-retrieval (direct) and one-shot RAG baselines, so they run the same
SFT model as the search agent and differ only in how much retrieval they get."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class ForcedAnswerPolicy:
    policy: object
    prefix: str = "answer:"

    def generate(self, prompts, **kw):
        out = self.policy.generate([p + self.prefix for p in prompts], **kw)
        return [[dataclasses.replace(c, text=self.prefix + c.text) for c in row] for row in out]
