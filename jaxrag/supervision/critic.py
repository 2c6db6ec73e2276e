"""PRM-guided best-of-N (RAG-Gym Alg. 1): a trained critic r_φ(s, a) scores N candidates per step and the rollout
engine executes argmax_a r_φ(s, a) (METHODS.md §5; inference: T = 1.0, N = 10).

The critic's input is exactly what the Bradley–Terry trainer saw (records.pair_examples ->
train.batching.pair_batch): the state's prompt text tokenized with add_bos, then the action's raw text tokenized
on its own, right-padded, the scalar head read at the last action token (`read_index`). Texts are tokenized with
the critic's OWN tokenizer, so the critic may be another model family than the policy. Device side: one jitted
`critic_scores` over bucketed shapes (rows: powers of two up to batch_size; columns: seq_buckets), so a handful
of shapes compile once. Best-of-N (`score_states`) computes each state's prompt once: prefilled into a KV cache
that is forked into its N candidates' rows (generate.fork), over which only the candidates' tokens run (the same
scores, about 1/N of the prompt compute; `share_prefix=False` scores every sequence whole).
Prompts are rendered within the critic's own budget (`agent.render(state, fits)`: the agent's shorter views of the
state); an input still too long keeps the action whole (its end, if the action alone is too long) and drops the
prompt's middle (its first and last halves kept, as JaxPolicy), with a warning.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrag.env.mdp import INVALID, State
from jaxrag.env.rollout import Candidate
from jaxrag.models import critic_scores
from jaxrag.models.config import ModelConfig
from jaxrag.models.transformer import forward_cached_hidden, init_cache, prefill
from jaxrag.sampling import fork, left_pad
from jaxrag.supervision.judges import ranks_from_scores
from jaxrag.supervision.records import ProcessRecord
from jaxrag.train.batching import pick_bucket

log = logging.getLogger(__name__)

SEQ_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)


@functools.lru_cache(maxsize=8)
def _score_fn(cfg: ModelConfig):
    """One jitted scorer per model config, shared by every CriticScorer over it (compiles per shape once)."""
    return jax.jit(functools.partial(critic_scores, cfg))


@functools.lru_cache(maxsize=8)
def _shared_prefix_fn(cfg: ModelConfig):
    """Scores of candidates that share their state's prompt: each prompt is prefilled once (left-padded, [P,Tp]),
    its KV cache forked into its candidates' rows (`rows` [R]), and only the candidates' own tokens ([R,Ta],
    right-padded) run through the model over that cache; the head reads each one's last token (`read` [R])."""

    def fn(params, head, prefix, prefix_pos, prefix_valid, rows, cand, cand_valid, read):
        cache = init_cache(cfg, prefix.shape[0], prefix.shape[1] + cand.shape[1], dtype=cfg.dtype)
        _, cache = prefill(cfg, params, prefix, prefix_pos, prefix_valid, cache)
        cache = fork(cache, rows)
        start = jnp.sum(prefix_valid, axis=1).astype(jnp.int32)[rows]
        pos = start[:, None] + jnp.arange(cand.shape[1], dtype=jnp.int32)[None]
        hidden, _ = forward_cached_hidden(cfg, params, cand, pos, cand_valid, cache)
        h = jnp.take_along_axis(hidden.astype(jnp.float32), read[:, None, None], axis=1)[:, 0]
        return h @ head["w"] + head["b"]

    return jax.jit(fn)


def _pow2(n: int, cap: int) -> int:
    r = 1
    while r < n:
        r *= 2
    return min(r, cap) if n <= cap else cap


class CriticScorer:
    """r_φ(prompt, action) for many (prompt, action) texts at once."""

    def __init__(self, model_cfg: ModelConfig, params, head, tokenizer, agent=None, *, batch_size: int = 32,
                 seq_buckets: Sequence[int] = SEQ_BUCKETS, add_bos: bool = True, share_prefix: bool = True,
                 min_rows: int = 1):
        """min_rows: the fewest rows (and prompt rows of score_shared) a batch is padded to, capped at batch_size:
        fewer compiled shapes where compiling costs more than the padding (a tiny model)."""
        if batch_size < 1 or min_rows < 1:
            raise ValueError(f"CriticScorer: batch_size={batch_size}, min_rows={min_rows}; both must be >= 1")
        self.min_rows = min(min_rows, batch_size)
        self.cfg, self.params, self.head, self.tokenizer, self.agent = model_cfg, params, head, tokenizer, agent
        self.share_prefix = share_prefix  # score_states: each state's prompt once for its candidates (score_shared)
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
        return max(_pow2(n, self.batch_size), self.min_rows)

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

    def score_shared(self, prompts: Sequence[Sequence[int]], actions: Sequence[Sequence[Sequence[int]]]) -> list[np.ndarray]:
        """Scores of each prompt's candidate actions (token ids: the prompt with BOS, each action without), with
        the prompt computed once per state and shared by its candidates (`_shared_prefix_fn`): the same values as
        `score_ids` on the concatenations (tests/test_supervision_critic.py), at about 1/N of the prompt compute.
        Every action must be non-empty and fit after its prompt (`score_states` checks, else uses score_ids)."""
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out = [np.zeros(len(a), np.float32) for a in actions]
        i = 0
        while i < len(order):  # a chunk: as many states as fit batch_size candidate rows (at least one state)
            chunk, rows_n = [], 0
            while i < len(order) and (not chunk or rows_n + len(actions[order[i]]) <= self.batch_size):
                chunk.append(order[i])
                rows_n += len(actions[order[i]])
                i += 1
            P = self._rows(len(chunk))
            R = max(_pow2(rows_n, max(self.batch_size, rows_n)), P)
            Tp = pick_bucket(max(len(prompts[j]) for j in chunk), self.seq_buckets, "critic prompt")
            Ta = max(_pow2(max(len(a) for j in chunk for a in actions[j]), self.max_len), 32)  # few shapes
            prefix, ppos, pvalid = left_pad([prompts[j] for j in chunk], P, Tp)
            cand = np.full((R, Ta), self.pad_id, np.int32)
            cvalid = np.zeros((R, Ta), bool)
            rows, read = np.zeros(R, np.int32), np.zeros(R, np.int32)
            r = 0
            for k, j in enumerate(chunk):
                for a in actions[j]:
                    cand[r, :len(a)], cvalid[r, :len(a)], rows[r], read[r] = a, True, k, len(a) - 1
                    r += 1
            self.shapes.add(("shared", P, Tp, R, Ta))
            scores = np.asarray(_shared_prefix_fn(self.cfg)(self.params, self.head, prefix, ppos, pvalid, rows, cand,
                                                            cvalid, read), np.float32)
            r = 0
            for j in chunk:
                out[j] = scores[r:r + len(actions[j])]
                r += len(actions[j])
        return out

    def score_states(self, states: Sequence[State], texts: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Scores of each state's candidate texts (prompts rendered by the scorer's agent), one batched pass:
        each state's prompt computed once for all its candidates (`score_shared`) when every input fits whole,
        else every (prompt, action) on its own (`score_texts`, which cuts over-long inputs)."""
        if self.agent is None:
            raise ValueError("CriticScorer.score_states needs an agent to render the states' prompts")
        prompts = [self.agent.render(s, self.fits(max((len(self.tokenizer.encode(t)) for t in ts), default=1)))
                   for s, ts in zip(states, texts)]
        p_ids = [self.tokenizer.encode(p, add_bos=self.add_bos) for p in prompts]
        a_ids = [[self.tokenizer.encode(t) for t in ts] for ts in texts]
        if self.share_prefix and all(p and all(a and len(p) + len(a) <= self.max_len for a in acts)
                                     for p, acts in zip(p_ids, a_ids)):
            return self.score_shared(p_ids, a_ids)
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
