"""PRM-guided best-of-N (RAG-Gym Alg. 1): a trained critic r_φ(s, a) scores N candidates per step and the rollout
engine executes argmax_a r_φ(s, a) (METHODS.md §5; inference: T = 1.0, N = 10).

The critic's input is exactly what the Bradley–Terry trainer saw (records.pair_examples ->
train.batching.pair_batch): the state's prompt text tokenized with add_bos, then the action's raw text tokenized
on its own, right-padded, the scalar head read at the last action token (`read_index`). Texts are tokenized with
the critic's OWN tokenizer, so the critic may be another model family than the policy. Device side: one jitted
`critic_scores` over bucketed shapes (rows: powers of two up to batch_size; columns: seq_buckets), so a handful
of shapes compile once. Prompts are rendered within the critic's own budget (`agent.render(state, fits)`: the
agent's shorter views of the state); an input still too long keeps the action whole (its end, if the action alone
is too long) and drops the prompt's middle (its first and last halves kept, as JaxPolicy), with a warning.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Sequence

import jax
import numpy as np

from jaxrag.env.mdp import INVALID, State
from jaxrag.env.rollout import Candidate
from jaxrag.models import critic_scores
from jaxrag.models.config import ModelConfig
from jaxrag.supervision.judges import ranks_from_scores
from jaxrag.supervision.records import ProcessRecord
from jaxrag.train.batching import pick_bucket

log = logging.getLogger(__name__)

SEQ_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)


@functools.lru_cache(maxsize=8)
def _score_fn(cfg: ModelConfig):
    """One jitted scorer per model config, shared by every CriticScorer over it (compiles per shape once)."""
    return jax.jit(functools.partial(critic_scores, cfg))


class CriticScorer:
    """r_φ(prompt, action) for many (prompt, action) texts at once."""

    def __init__(self, model_cfg: ModelConfig, params, head, tokenizer, agent=None, *, batch_size: int = 32,
                 seq_buckets: Sequence[int] = SEQ_BUCKETS, add_bos: bool = True):
        if batch_size < 1:
            raise ValueError(f"CriticScorer: batch_size={batch_size} must be >= 1")
        self.cfg, self.params, self.head, self.tokenizer, self.agent = model_cfg, params, head, tokenizer, agent
        self.batch_size, self.add_bos = batch_size, add_bos
        self.seq_buckets = tuple(sorted({min(b, model_cfg.max_seq_len) for b in seq_buckets} | {model_cfg.max_seq_len}))
        self.max_len = self.seq_buckets[-1]
        self.pad_id = model_cfg.pad_id
        self._fn = _score_fn(model_cfg)
        self.shapes: set[tuple[int, int]] = set()  # (rows, columns) compiled so far

    def encode(self, prompt: str, action: str) -> list[int]:
        """prompt tokens (with BOS) + action tokens; too long -> the prompt's middle dropped, the action kept."""
        p = self.tokenizer.encode(prompt, add_bos=self.add_bos)
        a = self.tokenizer.encode(action)
        if not a:  # an empty action still needs a token to read: the head reads the prompt's last token
            a, p = p[-1:], p[:-1]
        if not p + a:
            return [self.pad_id]
        if len(p) + len(a) > self.max_len:
            log.warning("critic input of %d tokens cut to %d (prompt middle dropped)", len(p) + len(a), self.max_len)
            a = a[-(self.max_len - 1):]
            keep = self.max_len - len(a)
            tail = keep // 2
            p = p[:keep - tail] + (p[len(p) - tail:] if tail else [])
        return p + a

    def fits(self, reserve: int):
        """The prompt-budget test for `agent.render(state, fits)`: prompt tokens + `reserve` action tokens."""
        return lambda prompt: len(self.tokenizer.encode(prompt, add_bos=self.add_bos)) + reserve <= self.max_len

    def _rows(self, n: int) -> int:
        r = 1
        while r < n:
            r *= 2
        return min(r, self.batch_size) if n <= self.batch_size else self.batch_size

    def score_ids(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        """Scores of token sequences (read at each one's last token), [len(seqs)] float32."""
        out = np.zeros(len(seqs), np.float32)
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            rows = self._rows(len(idx))
            cols = pick_bucket(max(len(seqs[i]) for i in idx), self.seq_buckets, "critic input")
            tokens = np.full((rows, cols), self.pad_id, np.int32)
            seg = np.zeros((rows, cols), np.int32)
            seg[:, 0] = 1  # padding rows: one live token, so no row attends to nothing
            read = np.zeros(rows, np.int32)
            for j, i in enumerate(idx):
                tokens[j, :len(seqs[i])] = seqs[i]
                seg[j, :len(seqs[i])] = 1
                read[j] = len(seqs[i]) - 1
            pos = np.broadcast_to(np.arange(cols, dtype=np.int32), (rows, cols))
            self.shapes.add((rows, cols))
            scores = np.asarray(self._fn(self.params, self.head, tokens, pos, seg, read), np.float32)
            out[idx] = scores[:len(idx)]
        return out

    def score_texts(self, prompts: Sequence[str], actions: Sequence[str]) -> np.ndarray:
        if len(prompts) != len(actions):
            raise ValueError(f"score_texts: {len(prompts)} prompts for {len(actions)} actions")
        return self.score_ids([self.encode(p, a) for p, a in zip(prompts, actions)])

    def score_states(self, states: Sequence[State], texts: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Scores of each state's candidate texts (prompts rendered by the scorer's agent), one batched pass."""
        if self.agent is None:
            raise ValueError("CriticScorer.score_states needs an agent to render the states' prompts")
        prompts = [self.agent.render(s, self.fits(max((len(self.tokenizer.encode(t)) for t in ts), default=1)))
                   for s, ts in zip(states, texts)]
        flat_p = [p for p, ts in zip(prompts, texts) for _ in ts]
        flat_a = [t for ts in texts for t in ts]
        flat = self.score_texts(flat_p, flat_a)
        out, i = [], 0
        for ts in texts:
            out.append(flat[i:i + len(ts)])
            i += len(ts)
        return out


@dataclasses.dataclass
class CriticSelect:
    """`select` for jaxrag.env.rollout.rollout: execute argmax_a r_φ(s, a) (ties: the first). valid_only: argmax
    over the candidates that parsed (when any did) instead of all N. `last` keeps the latest scores."""

    scorer: CriticScorer
    valid_only: bool = False
    last: list = dataclasses.field(default_factory=list)

    def __call__(self, states: Sequence[State], cands: Sequence[Sequence[Candidate]]) -> list[int]:
        texts = [[str(getattr(c.completion, "text", c.action.raw)) for c in cs] for cs in cands]
        scores = self.scorer.score_states(states, texts)
        self.last = [s.tolist() for s in scores]
        picks = []
        for cs, s in zip(cands, scores):
            allowed = [i for i, c in enumerate(cs) if c.action.kind != INVALID] if self.valid_only else []
            allowed = allowed or list(range(len(cs)))
            picks.append(max(allowed, key=lambda i: (s[i], -i)))
        return picks


def critic_select(scorer: CriticScorer, valid_only: bool = False) -> CriticSelect:
    if getattr(scorer, "agent", None) is None:
        raise ValueError("critic_select: the CriticScorer needs an agent (it renders each state's prompt)")
    return CriticSelect(scorer, valid_only)


def score_records(scorer: CriticScorer, records: Sequence[ProcessRecord], *,
                  use_record_prompt: bool = True) -> list[ProcessRecord]:
    """The critic's scores of the records' candidates (source "critic"; ranks from scores), one batched pass.
    use_record_prompt: the record's own prompt (what its preference pairs carry) instead of re-rendering."""
    prompts = [r.prompt if use_record_prompt else scorer.agent.render(r.state()) for r in records]
    flat = scorer.score_texts([p for p, r in zip(prompts, records) for _ in r.candidates],
                              [c.raw for r in records for c in r.candidates])
    out, i = [], 0
    for r in records:
        s = [float(x) for x in flat[i:i + len(r.candidates)]]
        i += len(r.candidates)
        ranks = ranks_from_scores(s)
        cands = [dataclasses.replace(c, score=s[j], rank=ranks[j], rationale="", failure="")
                 for j, c in enumerate(r.candidates)]
        out.append(dataclasses.replace(r, candidates=cands, source="critic"))
    return out
