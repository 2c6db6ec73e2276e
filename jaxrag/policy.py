"""Policy: text prompts in, sampled completions out. The rollout engine knows only this protocol.

`JaxPolicy` runs jaxrag's jitted sampler over a params pytree; tests use scripted fakes with the same method.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Protocol, Sequence

import jax

from jaxrag.generate import SamplingParams, sample
from jaxrag.models.config import ModelConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Completion:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "eos" | "stop" | "length"
    prompt_ids: list[int] = dataclasses.field(default_factory=list)


class Policy(Protocol):
    def generate(
        self,
        prompts: Sequence[str],
        *,
        n: int = 1,
        temperature: float = 0.0,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        seed: int = 0,
    ) -> list[list[Completion]]:
        """Outer list: one entry per prompt; inner: its n samples."""
        ...


class JaxPolicy:
    """The model + tokenizer as a Policy. `max_prompt_tokens` keeps the end of over-long prompts (logged)."""

    def __init__(self, cfg: ModelConfig, params, tokenizer, *, top_k: int = 0, top_p: float = 1.0, add_bos: bool = True, max_prompt_tokens: int | None = None):
        self.cfg, self.params, self.tokenizer = cfg, params, tokenizer
        self.top_k, self.top_p, self.add_bos = top_k, top_p, add_bos
        self.max_prompt_tokens = max_prompt_tokens

    def encode_prompt(self, prompt: str, max_new_tokens: int) -> list[int]:
        ids = self.tokenizer.encode(prompt, add_bos=self.add_bos)
        limit = min(self.max_prompt_tokens or self.cfg.max_seq_len, self.cfg.max_seq_len - max_new_tokens)
        if len(ids) > limit:
            log.warning("prompt of %d tokens truncated to its last %d", len(ids), limit)
            ids = ids[:1] + ids[len(ids) - limit + 1:] if self.add_bos else ids[-limit:]
        return ids

    def generate(self, prompts, *, n=1, temperature=0.0, max_new_tokens=128, stop=None, seed=0):
        if not prompts:
            return []
        encoded = [self.encode_prompt(p, max_new_tokens) for p in prompts]
        batch = [ids for ids in encoded for _ in range(n)]
        sp = SamplingParams(temperature=float(temperature), top_k=self.top_k, top_p=self.top_p, max_new_tokens=max_new_tokens)
        out = sample(self.cfg, self.params, batch, sp, jax.random.PRNGKey(seed), stop_strings=list(stop) if stop else None, tokenizer=self.tokenizer)
        results: list[list[Completion]] = []
        for i, prompt_ids in enumerate(encoded):
            row = []
            for j in range(n):
                ids, logps = out.row(i * n + j)
                row.append(Completion(self.tokenizer.decode(ids), ids, logps, out.finish_reason[i * n + j], prompt_ids))
            results.append(row)
        return results
