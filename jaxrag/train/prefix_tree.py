"""The prefix-tree training layout: a step's rows packed as a trie over token ids, each shared prefix computed once.

A row is prompt ids + completion ids (an RL action row, a DPO chosen or rejected sequence). The rows of a batch
share long prefixes: the G episodes of a question start with the same first prompt, a later turn's prompt repeats
the history, a DPO pair's chosen and rejected share their state prompt. The per-row layout computes every row's
prefix again; this layout computes it once.

Packing (`pack_tree`). The rows are sorted by their ids; in that order a row shares its longest common prefix with
any earlier row with the row just before it, so appending each row's ids after that shared prefix lays a trie's
nodes (one node per token) out in DFS pre-order, and rows go greedily into packed sequences of `length` tokens (a
row goes whole into one pack: its ancestors must be there). Each token gets its DFS interval [enter, exit]: enter is
its own index in the pack, exit the index of the last token of its subtree. Key j is visible to query i iff
j <= i and enter[j] <= enter[i] and exit[i] <= exit[j], i.e. j is i or an ancestor of i (with token-level nodes
enter = index, so `tree_exit` alone carries the tree; the mask is a subset of the causal one, so block-causal
attention still skips the upper triangle: jaxrag.models.transformer.tree_mask). Distinct trees in one pack have
disjoint intervals: nothing leaks between them. Padding has exit = its own index and sees only itself. A token's
position is its depth in its path (the row index it has in the per-row layout), so RoPE matches that layout.

Reads. The loss is read at each row's trained tokens: the logit predicting a row's token at depth d sits at the
row's token at depth d - 1 (for the first completion token: its last prompt token, possibly shared with rows whose
next token differs), so a read is a triple (position in the pack, target id, the row's per-token quantities), never
"the next token of the packed sequence". Every row keeps its own reads, so identical completions in a group count
with their multiplicity. Reads are [P, M]: per pack, so microbatches (grad_accum) and data sharding split packs
whole along the leading axis.

Cost (`Work`, `choose_layout`): the forward's token slots (padding included), the attention score entries
(block-causal skipping) and the LM head's rows, weighed by the model's FLOPs per unit; "auto" takes the tree when
it costs at most AUTO_MARGIN of the rows and the attention path takes the tree mask.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxrag.models.transformer import causal_blocks, tree_attention_unsupported
from jaxrag.train.batching import bucket_size, pair_batch, pick_bucket

LAYOUTS = ("auto", "rows", "tree")
# "auto" takes the tree when its estimated FLOPs are at most this share of the rows' (the gather of the reads, the
# mask build and the sort are not in the estimate)
AUTO_MARGIN = 0.9


def check_layout(value: str, key: str) -> None:
    if value not in LAYOUTS:
        raise ValueError(f"{key}: {value!r} is not one of {LAYOUTS}")


@dataclasses.dataclass
class Tree:
    """A packed forest. tokens/positions/segment_ids/tree_exit [P,L] int32; reads read_pos/read_target [P,M] int32,
    read_valid [P,M] float32. Per row (input order): row_pack [R] (its pack), row_index[r] [len] (the pack index of
    each of its tokens), row_reads[r] [len(completion)] (the read slot of each completion token, -1 where not read)."""
    tokens: np.ndarray
    positions: np.ndarray
    segment_ids: np.ndarray
    tree_exit: np.ndarray
    read_pos: np.ndarray
    read_target: np.ndarray
    read_valid: np.ndarray
    row_pack: np.ndarray
    row_index: list
    row_reads: list

    def arrays(self) -> dict:
        """The model inputs and reads as a batch dict (read_valid as loss_mask)."""
        return {"tokens": self.tokens, "positions": self.positions, "segment_ids": self.segment_ids,
                "tree_exit": self.tree_exit, "read_pos": self.read_pos, "read_target": self.read_target,
                "loss_mask": self.read_valid}

    def scatter(self, per_row: Sequence, dtype=np.float32) -> np.ndarray:
        """Per-row values aligned with each row's completion -> [P,M] at the rows' reads (0 elsewhere)."""
        out = np.zeros(self.read_pos.shape, dtype)
        for r, vals in enumerate(per_row):
            slots = self.row_reads[r]
            keep = slots >= 0
            out[self.row_pack[r], slots[keep]] = np.asarray(vals)[keep]
        return out

    def gather(self, reads: np.ndarray) -> list[np.ndarray]:
        """[P,M] values at the reads -> per row, aligned with its completion (0 where not read)."""
        out = []
        for r, slots in enumerate(self.row_reads):
            x = np.zeros(len(slots), reads.dtype)
            keep = slots >= 0
            x[keep] = reads[self.row_pack[r], slots[keep]]
            out.append(x)
        return out


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def assign_packs(seqs: Sequence[Sequence[int]], length: int, where: str = "row",
                 units: Sequence[Sequence[int]] | None = None, reads: Sequence[int] | None = None,
                 read_cap: int | None = None) -> tuple[list[int], list[int], list[int]]:
    """The row order, each row's pack and the prefix it shares with the row before it in its pack (0 for a pack's
    first row). units: groups of rows that go into one pack together (a DPO pair); default each row alone. Rows are
    sorted within a unit and units by their first row; greedy: a unit opens a new pack when its new tokens do not
    fit. Sharing only with the previous row keeps the layout a pre-order whatever the order; sorting makes that
    the longest prefix shared with any earlier row. reads / read_cap: each row's read tokens and the most a pack
    may hold (a unit that would pass it opens a new pack; a unit over it alone is one pack)."""
    units = [[i] for i in range(len(seqs))] if units is None else units
    units = sorted((sorted(u, key=lambda i: list(seqs[i])) for u in units), key=lambda u: list(seqs[u[0]]))
    order, pack_of, shared = [], [0] * len(seqs), [0] * len(seqs)
    n_packs, used, used_reads, prev = 0, length + 1, 0, None
    reads = [0] * len(seqs) if reads is None else reads
    read_cap = sum(reads) if read_cap is None else read_cap

    def chain(u, before):
        ks = []
        for i in u:
            ks.append(_lcp(seqs[before], seqs[i]) if before is not None else 0)
            before = i
        return ks, sum(len(seqs[i]) - k for i, k in zip(u, ks))

    for u in units:
        ks, cost = chain(u, prev)
        n_reads = sum(reads[i] for i in u)
        if used + cost > length or (used and used_reads + n_reads > read_cap):
            ks, cost = chain(u, None)
            n_packs, used, used_reads = n_packs + 1, 0, 0
            if cost > length:
                what = f"{where} {u[0]}" if len(u) == 1 else f"{where}s {sorted(u)} (packed together)"
                raise ValueError(f"{what} has {cost} tokens, more than the pack length {length}")
        for i, k in zip(u, ks):
            pack_of[i], shared[i] = n_packs - 1, k
            order.append(i)
        used += cost
        used_reads += n_reads
        prev = u[-1]
    return order, pack_of, shared


def pack_bucket(n: int, multiple: int = 1) -> int:
    """Packs per batch: 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (two sizes per octave, under 34% empty packs), then up to a
    multiple of `multiple`. The packs' count follows the step's data (how much its rows share), so it takes fewer
    sizes than padded rows (bucket_size): each (P, L) pair compiles the train step once."""
    n = max(int(n), 1)
    b = 1 << (n - 1).bit_length()
    if b >= 4 and 3 * b // 4 >= n:
        b = 3 * b // 4
    return -(-b // multiple) * multiple


def read_bucket(n: int) -> int:
    """Read slots: a power of two, at least 8 (a read slot costs its logits row)."""
    return max(8, 1 << (max(int(n), 1) - 1).bit_length())


def pack_tree(rows: Sequence[tuple[Sequence[int], Sequence[int], Sequence[int] | None]], length: int,
              pad_id: int = 0, pack_multiple: int = 1, where: str = "row",
              units: Sequence[Sequence[int]] | None = None) -> Tree:
    """rows: (prompt ids, completion ids, completion mask or None = all read) -> a Tree of packs of `length`.
    P = pack_bucket(packs, pack_multiple); M = read slots per pack: read_bucket(length // 2), or the most reads of
    one unit where that is more. A pack closes when its reads would pass M, so M follows the pack length alone and a
    run compiles one shape per (packs, length), not per (packs, length, reads). units: see assign_packs."""
    if not rows:
        raise ValueError("no rows to pack")
    seqs = [list(p) + list(c) for p, c, _ in rows]
    for i, (p, c, _) in enumerate(rows):
        if not p:
            raise ValueError(f"{where} {i}: no prompt ids (nothing predicts its first token)")
    n_read = [len(c) if m is None else sum(1 for x in m if x) for _, c, m in rows]
    unit_reads = max(sum(n_read[i] for i in u) for u in units) if units is not None else max(n_read)
    M = max(read_bucket(length // 2), read_bucket(unit_reads))
    order, pack_of, shared = assign_packs(seqs, length, where, units, n_read, M)
    n_packs = max(pack_of) + 1
    P = pack_bucket(n_packs, pack_multiple)
    tokens = np.full((P, length), pad_id, np.int32)
    positions = np.zeros((P, length), np.int32)
    seg = np.zeros((P, length), np.int32)
    exit_ = np.broadcast_to(np.arange(length, dtype=np.int32), (P, length)).copy()
    fill = [0] * n_packs
    row_index: list = [None] * len(rows)
    prev = None
    for i in order:
        s, p, k = seqs[i], pack_of[i], shared[i]
        start = fill[p]
        new = np.arange(start, start + len(s) - k, dtype=np.int32)
        idx = np.concatenate([row_index[prev][:k], new]) if k else new
        tokens[p, new] = s[k:]
        positions[p, new] = np.arange(k, len(s), dtype=np.int32)
        seg[p, new] = 1
        fill[p] = start + len(new)
        exit_[p, idx] = fill[p] - 1   # append-only pre-order: the row's path ends its subtrees here for now
        row_index[i] = idx
        prev = i
    # reads: a completion token at depth d is predicted at the row's token at depth d - 1
    per_pack: list[list[tuple[int, int]]] = [[] for _ in range(n_packs)]
    row_reads = []
    for i, (prompt, comp, mask) in enumerate(rows):
        slots = np.full(len(comp), -1, np.int64)
        reads = per_pack[pack_of[i]]
        for t in range(len(comp)):
            if mask is None or mask[t]:
                slots[t] = len(reads)
                d = len(prompt) + t
                reads.append((int(row_index[i][d - 1]), int(seqs[i][d])))
        row_reads.append(slots)
    assert max(len(r) for r in per_pack) <= M
    read_pos = np.zeros((P, M), np.int32)
    read_target = np.zeros((P, M), np.int32)
    read_valid = np.zeros((P, M), np.float32)
    for p, reads in enumerate(per_pack):
        if reads:
            a = np.asarray(reads, np.int32)
            read_pos[p, :len(a)], read_target[p, :len(a)], read_valid[p, :len(a)] = a[:, 0], a[:, 1], 1.0
    return Tree(tokens, positions, seg, exit_, read_pos, read_target, read_valid, np.asarray(pack_of, np.int32),
                row_index, row_reads)


def distinct_tokens(seqs: Sequence[Sequence[int]]) -> int:
    """Nodes of the trie of all the rows: the tokens of a step that are distinct (each shared prefix counted once)."""
    order = sorted(range(len(seqs)), key=lambda i: list(seqs[i]))
    total, prev = 0, None
    for i in order:
        total += len(seqs[i]) - (_lcp(seqs[prev], seqs[i]) if prev is not None else 0)
        prev = i
    return total


# ------------------------------------------------------------------------------------------------------ cost
def attention_entries(T: int) -> int:
    """Score entries block-causal attention computes for one row of T tokens (query block i of n reads keys
    [0, (i+1)T/n): T²(n+1)/(2n)); jaxrag.models.transformer.causal_blocks picks n."""
    n = causal_blocks(T)
    return T * T * (n + 1) // (2 * n)


@dataclasses.dataclass(frozen=True)
class Work:
    """What one forward computes: token slots through the layers (padding included), attention score entries, and
    rows of the LM head."""
    tokens: int = 0
    attention: int = 0
    head: int = 0

    def __add__(self, other: "Work") -> "Work":
        return Work(self.tokens + other.tokens, self.attention + other.attention, self.head + other.head)

    def without_head(self) -> "Work":
        """The same work for an objective that computes no LM head (the critic's)."""
        return dataclasses.replace(self, head=0)

    def flops(self, mcfg) -> float:
        """Forward FLOPs for model config `mcfg` (the backward is about twice that for every term alike)."""
        D, H, K, Dh, F = mcfg.d_model, mcfg.n_heads, mcfg.n_kv_heads, mcfg.head_dim, mcfg.d_ff
        per_token = 2 * mcfg.n_layers * (D * (H + 2 * K) * Dh + H * Dh * D + 3 * D * F)
        per_entry = 4 * mcfg.n_layers * H * Dh   # q·k and p·v over every head
        return float(self.tokens * per_token + self.attention * per_entry + self.head * 2 * D * mcfg.vocab_size)


def rows_work(shapes: Sequence[tuple[int, int]]) -> Work:
    """The per-row layout's work over its batches' [R, T] shapes (the head computes every position)."""
    return sum((Work(r * t, r * attention_entries(t), r * t) for r, t in shapes), Work())


def tree_work(tree: Tree) -> Work:
    P, L = tree.tokens.shape
    return Work(P * L, P * attention_entries(L), tree.read_pos.size)


def best_tree(rows, buckets: Sequence[int], mcfg, pad_id: int = 0, pack_multiple: int = 1,
              where: str = "row", units=None, lm_head: bool = True) -> Tree:
    """pack_tree at the pack length (a bucket holding the longest row) whose work costs the fewest FLOPs
    (lm_head=False: the objective computes no LM head at the reads, the critic's)."""
    longest = max(len(p) + len(c) for p, c, _ in rows)
    pick_bucket(longest, buckets, f"{where} (prompt + completion ids)")
    best, cost = None, None
    for length in sorted(b for b in buckets if b >= longest):
        t = pack_tree(rows, length, pad_id, pack_multiple, where, units)
        w = tree_work(t)
        c = (w if lm_head else w.without_head()).flops(mcfg)
        if cost is None or c < cost:
            best, cost = t, c
    return best


def choose_layout(mode: str, rows: Work, tree: Work | None, mcfg) -> tuple[str, str]:
    """(layout, why) for `mode` "rows" | "tree" | "auto". auto: the tree when the attention path takes its mask
    (jaxrag.models.transformer.tree_attention_unsupported) and its FLOPs are at most AUTO_MARGIN of the rows'."""
    check_layout(mode, "train_layout")
    if mode != "auto":
        return mode, "forced"
    reason = tree_attention_unsupported(mcfg)
    if reason:
        return "rows", reason
    ratio = tree.flops(mcfg) / max(rows.flops(mcfg), 1.0)
    if ratio <= AUTO_MARGIN:
        return "tree", f"tree costs {ratio:.2f} of the rows' FLOPs"
    return "rows", f"tree would cost {ratio:.2f} of the rows' FLOPs (> {AUTO_MARGIN})"


# ------------------------------------------------------------------------------------------ DPO and critic pairs
def pair_tree_batch(pairs, tree: Tree) -> dict:
    """Preference pairs as one prefix-tree batch; `tree` packs their rows (pair i: row 2i chosen, 2i+1 rejected;
    built by pair_tree with each pair in one pack). Adds, per pair slot of a pack (Q slots):
    - pair_weight [P,Q]: 1 / pairs on each pair slot, 0 on padding slots: the mean over pairs is a weighted sum,
      exact under microbatches of whole packs;
    - read_seq [P,M] (DPO): 2 * the pair's slot in its pack + side: the sequence log-probs are per-pack segment sums
      of the reads;
    - pair_last [P,Q,2] (Bradley-Terry): where the chosen and the rejected row's last token sits in the pack (the
      critic's score is read there, as batching.pair_batch's read_index)."""
    n = len(pairs)
    slot = np.zeros(n, np.int64)
    per_pack: dict[int, int] = {}
    for i in range(n):
        p = int(tree.row_pack[2 * i])
        slot[i] = per_pack.get(p, 0)
        per_pack[p] = int(slot[i]) + 1
    Q = bucket_size(max(per_pack.values()), 1)
    b = tree.arrays()
    b["read_seq"] = tree.scatter([np.full(len(tree.row_reads[r]), 2 * slot[r // 2] + r % 2) for r in range(2 * n)],
                                 np.int32)
    w = np.zeros((tree.tokens.shape[0], Q), np.float32)
    last = np.zeros((tree.tokens.shape[0], Q, 2), np.int32)
    for i in range(n):
        w[tree.row_pack[2 * i], slot[i]] = 1.0 / n
        for side in (0, 1):
            last[tree.row_pack[2 * i], slot[i], side] = tree.row_index[2 * i + side][-1]
    b["pair_weight"], b["pair_last"] = w, last
    return b


def pair_rows(pairs, reads: bool = True) -> list[tuple]:
    """PreferencePairs -> pack_tree rows (2i chosen, 2i+1 rejected) and their units (each pair in one pack).
    reads=False: no read at the completions (the critic reads each row's last token, not its log-probs)."""
    rows = [(p.prompt, c, None if reads else [0] * len(c)) for p in pairs for c in (p.chosen, p.rejected)]
    return rows, [[2 * i, 2 * i + 1] for i in range(len(pairs))]


def pair_batch_auto(pairs, buckets: Sequence[int], mcfg, mode: str = "auto", pad_id: int = 0,
                    pack_multiple: int = 1, reads: str = "logprobs") -> dict:
    """The batch of preference pairs in the layout `mode` picks (choose_layout): batching.pair_batch or
    pair_tree_batch. reads: what the loss reads of a row (its Objective's `reads`): "logprobs" of the completion
    tokens (DPO and other paired policy losses) or "last", a head on the last token (the critic), which computes no
    LM head, so its cost model weighs the layers and attention alone."""
    check_layout(mode, "train_layout")
    if reads not in ("logprobs", "last"):
        raise ValueError(f"pair_batch_auto: reads {reads!r} is not 'logprobs' or 'last'")
    rows_b = None
    if mode != "tree":
        rows_b = pair_batch(pairs, buckets, pad_id)
        if mode == "rows":
            return rows_b
    rows, units = pair_rows(pairs, reads=reads == "logprobs")
    tree = best_tree(rows, buckets, mcfg, pad_id, pack_multiple, "pair row", units, lm_head=reads == "logprobs")
    if mode == "auto":
        B, _, T = rows_b["tokens"].shape
        rw, tw = rows_work([(2 * B, T)]), tree_work(tree)
        if reads == "last":
            rw, tw = rw.without_head(), tw.without_head()
        if choose_layout("auto", rw, tw, mcfg)[0] == "rows":
            return rows_b
    return pair_tree_batch(pairs, tree)
