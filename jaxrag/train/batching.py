"""Host examples -> fixed-shape numpy batches (the device boundary of the trainer).

Examples are token ids; a row's length is padded up to the smallest bucket in `buckets` that holds the longest
row of the batch, so the jitted step compiles once per bucket, never per step. Masks follow the tokens: loss_mask
is 1 on action tokens (what the policy generated), 0 on prompt / retrieved-document / padding tokens.

Batch layouts (all numpy, int32 unless noted):
- "sft":   tokens, positions, segment_ids [B,T]; loss_mask [B,T] float32
- "pairs": the same with a pair axis [B,2,T] (0 = chosen, 1 = rejected); read_index [B,2] (last action token, for
           the critic); optional ref_logps [B,2] float32 (precomputed DPO reference)
- "groups": tokens ... [N,T] with N = prompts x group size (groups contiguous); rewards [N] float32;
           optional old_logp / ref_logp [N,T] float32
- "ppo":   tokens ... [B,T]; rewards [B,T] float32 (per token, usually at an action's last token);
           old_logp, old_values [B,T] float32
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Sequence

import numpy as np


@dataclasses.dataclass
class SFTExample:
    prompt: list[int]  # context tokens (question, retrieved docs, history): masked
    completion: list[int]  # action tokens: trained


@dataclasses.dataclass
class PreferencePair:
    prompt: list[int]
    chosen: list[int]
    rejected: list[int]


@dataclasses.dataclass
class LabeledExample:
    prompt: list[int]
    completion: list[int]
    label: float  # 1 = desirable, 0 = undesirable (KTO); any per-completion value a loss of layout "labeled" reads


@dataclasses.dataclass
class Group:
    prompt: list[int]
    completions: list[list[int]]
    rewards: list[float]
    old_logps: list[list[float]] | None = None  # per completion token, from the sampler (None: on-policy)


def pick_bucket(length: int, buckets: Sequence[int], what: str = "example") -> int:
    for b in sorted(buckets):
        if length <= b:
            return b
    raise ValueError(f"{what} has {length} tokens, more than the largest bucket {max(buckets)}; "
                     f"raise train.seq_buckets or shorten the input")


def bucket_size(n: int, multiple: int = 1) -> int:
    """A count (rows, packs, reads) padded to a power of two up to 8, then to one of 4 sizes per octave (10, 12, 14,
    16, 20, 24, 28, 32, 40, ...: under 25% padding, few compiled shapes), then up to a multiple of `multiple`."""
    n = max(int(n), 1)
    if n <= 8:
        b = 1 << (n - 1).bit_length()
    else:
        step = 1 << ((n - 1).bit_length() - 3)
        b = -(-n // step) * step
    return -(-b // multiple) * multiple


def _rows(seqs: list[tuple[list[int], list[int]]], buckets: Sequence[int], pad_id: int, where: str):
    """[(prompt, completion)] -> tokens, positions, segment_ids, loss_mask, read_index, all [R,T]."""
    lengths = [len(p) + len(c) for p, c in seqs]
    for i, (p, c) in enumerate(seqs):
        if len(c) == 0:
            raise ValueError(f"{where} row {i}: empty completion (nothing to train on)")
    t = pick_bucket(max(lengths), buckets, f"{where} row {int(np.argmax(lengths))}")
    r = len(seqs)
    tokens = np.full((r, t), pad_id, np.int32)
    segment_ids = np.zeros((r, t), np.int32)
    loss_mask = np.zeros((r, t), np.float32)
    for i, (p, c) in enumerate(seqs):
        n = len(p) + len(c)
        tokens[i, :n] = np.asarray(list(p) + list(c), np.int32)
        segment_ids[i, :n] = 1
        loss_mask[i, len(p):n] = 1.0
    positions = np.broadcast_to(np.arange(t, dtype=np.int32), (r, t)).copy()
    read_index = np.asarray(lengths, np.int32) - 1
    return tokens, positions, segment_ids, loss_mask, read_index


def sft_batch(examples: Sequence[SFTExample], buckets: Sequence[int], pad_id: int = 0) -> dict:
    tokens, positions, seg, mask, _ = _rows([(e.prompt, e.completion) for e in examples], buckets, pad_id, "sft")
    return {"tokens": tokens, "positions": positions, "segment_ids": seg, "loss_mask": mask}


def labeled_batch(examples: Sequence[LabeledExample], buckets: Sequence[int], pad_id: int = 0) -> dict:
    """sft_batch's rows, one per completion, and each completion's label [B] (float32)."""
    batch = sft_batch([SFTExample(e.prompt, e.completion) for e in examples], buckets, pad_id)
    return {**batch, "labels": np.asarray([e.label for e in examples], np.float32)}


def pair_batch(pairs: Sequence[PreferencePair], buckets: Sequence[int], pad_id: int = 0) -> dict:
    seqs = [s for p in pairs for s in ((p.prompt, p.chosen), (p.prompt, p.rejected))]
    tokens, positions, seg, mask, read = _rows(seqs, buckets, pad_id, "pair")
    b, t = len(pairs), tokens.shape[1]
    return {"tokens": tokens.reshape(b, 2, t), "positions": positions.reshape(b, 2, t),
            "segment_ids": seg.reshape(b, 2, t), "loss_mask": mask.reshape(b, 2, t), "read_index": read.reshape(b, 2)}


def group_batch(groups: Sequence[Group], buckets: Sequence[int], pad_id: int = 0) -> dict:
    sizes = {len(g.completions) for g in groups}
    if len(sizes) != 1:
        raise ValueError(f"groups in one batch must have the same size, got sizes {sorted(sizes)}")
    for i, g in enumerate(groups):
        if len(g.rewards) != len(g.completions):
            raise ValueError(f"group {i}: {len(g.rewards)} rewards for {len(g.completions)} completions")
    seqs = [(g.prompt, c) for g in groups for c in g.completions]
    tokens, positions, seg, mask, _ = _rows(seqs, buckets, pad_id, "group")
    batch = {"tokens": tokens, "positions": positions, "segment_ids": seg, "loss_mask": mask,
             "rewards": np.asarray([r for g in groups for r in g.rewards], np.float32)}
    if all(g.old_logps is not None for g in groups):
        old = np.zeros(tokens.shape, np.float32)
        for i, (g, lp) in enumerate((g, lp) for g in groups for lp in g.old_logps):
            p = len(g.prompt)
            old[i, p:p + len(lp)] = lp
        batch["old_logp"] = old
    return batch


def batch_tokens(batch: dict) -> int:
    """Non-padding tokens in a host batch (for tokens/s)."""
    return int(np.sum(np.asarray(batch["segment_ids"]) > 0))


class BatchStream:
    """Deterministic, resumable batches over a list of examples: batch i depends only on (seed, i).

    Each epoch is a fresh permutation (seed, epoch); a batch takes `batch_size` consecutive examples of it and
    drops the epoch's remainder. `position` (batches handed out) is what a checkpoint stores; `seek(pos)` resumes.
    """

    def __init__(self, examples: Sequence, batch_size: int, make_batch, seed: int = 0, shuffle: bool = True):
        if batch_size > len(examples):
            raise ValueError(f"batch_size {batch_size} is larger than the dataset ({len(examples)} examples)")
        self.examples, self.batch_size, self.make_batch = list(examples), batch_size, make_batch
        self.seed, self.shuffle, self.position = seed, shuffle, 0
        self.per_epoch = len(self.examples) // batch_size

    def batch_at(self, i: int) -> dict:
        epoch, j = divmod(i, self.per_epoch)
        order = np.arange(len(self.examples))
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))
        idx = order[j * self.batch_size:(j + 1) * self.batch_size]
        return self.make_batch([self.examples[k] for k in idx])

    def seek(self, position: int) -> None:
        self.position = position

    def __iter__(self) -> Iterator[dict]:
        while True:
            batch = self.batch_at(self.position)
            self.position += 1
            yield batch
