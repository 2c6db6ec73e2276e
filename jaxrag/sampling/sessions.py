"""Cross-turn KV reuse: an episode keeps its cache between turns and only the appended tokens are prefilled.

A `SessionPool` holds each session's branches (one per candidate of its last call: a slot and the token ids it
holds) in fixed device buffers. `sample_sessions` is `generate.sample` for prompts that carry a session key: a
prompt that extends a branch (`extends`), or shares at least `min_shared` ids with one (`shared_prefix`), prefills
only the rest; any other is a counted fallback, prefilled in full. Results equal the full prefill's (a first turn
of distinct prompts bit for bit, later turns up to float rounding).

Details (the pool, which prompts reuse, the device side, exactness): docs/continuous_batching.md,
"Lock-step sessions".
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import time
from typing import Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrag.models.config import ModelConfig
from jaxrag.models.transformer import forward_cached_hidden, init_cache, logits_from_hidden
from jaxrag.sampling.generate import (Completions, SamplingParams, _fork, _prefill, bucket, cascade_cache, decode,
                                      left_pad)


def extends(held: Sequence[int], ids: Sequence[int]) -> bool:
    """The reuse test: `ids` start with the session's `held` ids (last prompt + completion) and are longer."""
    return 0 < len(held) < len(ids) and list(ids[:len(held)]) == list(held)


MIN_SHARED = 16   # the shortest shared prefix a session reuses when the new prompt does not extend its held ids


def shared_prefix(held: Sequence[int], ids: Sequence[int], minimum: int = MIN_SHARED) -> int:
    """How many leading ids of a new prompt `ids` a row holding `held` (last prompt + completion) can keep: all of
    `held` when `ids` extend it; else their longest common prefix when it is at least `minimum` ids (0: never) and
    at least a quarter of `ids`, so a prompt that rewrites its tail (a design whose question and instructions follow
    the growing history; a tokenizer merging the completion's last token with the appended text) keeps its common
    head; else 0. A continued row gathers, attends to and compacts its kept ids, so a short head costs more than it
    saves: in benchmarks.prefix_reuse a RAG-Gym ReAct turn keeping 8% of a 749-token prompt ran 7% slower than its full
    prefill, a ReasonRAG chat turn keeping 58% 1.6x faster. At most len(ids) - 1: one id is always prefilled (its
    logits start the decode). Keys/values at a position depend only on the ids up to it, so keeping the common
    prefix is the full prefill's computation (to float rounding)."""
    n = min(len(held), len(ids) - 1)
    if n <= 0:
        return 0
    diff = np.flatnonzero(np.asarray(held[:n]) != np.asarray(ids[:n]))
    common = int(diff[0]) if len(diff) else n
    if common == len(held):
        return common
    return common if minimum > 0 and common >= minimum and 4 * common >= len(ids) else 0


take_slots = jax.vmap(lambda buf, idx: jnp.take(buf, idx, axis=1))   # rows [n,K,S,Dh], slots [n,M] -> [n,K,M,Dh]


class PoolFull(ValueError):
    """A request the session pool cannot hold (more rows than slots, or a session longer than its slot)."""


@dataclasses.dataclass
class SessionPool:
    cfg: ModelConfig
    slots: int
    max_len: int
    min_shared: int = MIN_SHARED   # shared_prefix's minimum for a prompt that does not extend a branch (0: never)
    _kv: dict = dataclasses.field(init=False, repr=False)         # {"k": (L x [slots,K,max_len,Dh]), "v": ...}
    # key -> [(slot, token ids held in it)]: one BRANCH per candidate of the key's last call (one at n = 1)
    branches: dict = dataclasses.field(default_factory=dict, init=False)
    used: collections.OrderedDict = dataclasses.field(default_factory=collections.OrderedDict, init=False)  # LRU
    stats: collections.Counter = dataclasses.field(default_factory=collections.Counter, init=False)
    # the last call's store, deferred (`defer`): (cache, dest, kept, appended, M, T, N), store_rows' arguments after kv
    pending: tuple | None = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.slots < 1 or self.max_len < 1:
            raise ValueError(f"SessionPool: slots={self.slots}, max_len={self.max_len}; both must be >= 1")
        cache = init_cache(self.cfg, self.slots, self.max_len)
        self._kv = {"k": cache["k"], "v": cache["v"]}

    @property
    def kv(self) -> dict:
        """The pool's buffers with every live branch stored (a deferred store is carried out first)."""
        self.flush()
        return self._kv

    @property
    def nbytes(self) -> int:
        """The pool's buffers. Between calls the last call's decode cache is held too (its store is deferred)."""
        return sum(int(b.nbytes) for b in self._kv["k"] + self._kv["v"])

    def defer(self, cache: dict, dest: np.ndarray, kept, appended, M: int, T: int, N: int) -> None:
        """Hold a call's decode cache instead of storing every row now: decode row r belongs in slot dest[r]. Most
        of those rows are never read again (of a state's n candidates the next turn continues one; the others'
        slots are the session's next call's), so `flush` stores only rows whose slot a live branch still holds."""
        self.flush()
        self.pending = (cache, np.asarray(dest, np.int32), kept, appended, M, T, N)

    def flush(self, skip: Sequence[int] = ()) -> None:
        """Carry out the deferred store for the rows whose slot a live branch still holds and `skip` does not list
        (a call's sessions' slots other than the branches it continues: about to be overwritten)."""
        if self.pending is None:
            return
        cache, dest, kept, appended, M, T, N = self.pending
        self.pending = None
        dest = np.where(np.isin(dest, list(self.held_slots() - set(skip))), dest, self.slots).astype(np.int32)
        stored = int(np.sum(dest < self.slots))
        self.stats["stored_rows"] += stored
        if stored:
            self._kv = store_rows(self._kv, cache, jnp.asarray(dest), kept, appended, M, T, N)

    def held_slots(self) -> set:
        """Every slot a live branch holds."""
        return {s for bs in self.branches.values() for s, _ in bs}

    @property
    def slot_of(self) -> dict:
        """key -> its first branch's slot (its only one at n = 1)."""
        return {k: b[0][0] for k, b in self.branches.items()}

    @property
    def ids(self) -> dict:
        """key -> its first branch's held ids (its only ones at n = 1)."""
        return {k: b[0][1] for k, b in self.branches.items()}

    def clear(self) -> None:
        """Forget every session (new params: cached keys/values are stale)."""
        self.branches.clear()
        self.used.clear()
        self.pending = None

    def release(self, keys: Sequence[Hashable]) -> None:
        """Free the sessions `keys`, all their branches' slots."""
        for k in keys:
            self.branches.pop(k, None)
            self.used.pop(k, None)
        if self.pending is not None and not np.isin(self.pending[1], list(self.held_slots())).any():
            self.pending = None   # no row of the deferred store is wanted any more: free its cache now

    def pick(self, key: Hashable, ids: Sequence[int]) -> tuple[int | None, int]:
        """The branch of `key` that keeps the most leading ids of `ids` (`shared_prefix` with the pool's
        min_shared: one they extend, else the longest common prefix): (its slot, the ids kept); (None, 0) when
        none keeps any."""
        kept, slot = max(((shared_prefix(h, ids, self.min_shared), s) for s, h in self.branches.get(key, ())),
                         default=(0, None))
        return (slot, kept) if kept else (None, 0)

    def assign(self, keys: Sequence[Hashable], n: int = 1, keep: Sequence[int | None] | None = None
               ) -> list[list[int]]:
        """n slots per key, one per branch: its own first (keep[i], the branch the call reuses, always stays; extra
        ones beyond n are freed), then free ones, else the least recently used sessions not in `keys` are evicted
        whole. The keys' held ids are reset (their slots are about to be overwritten). PoolFull when keys x n
        exceeds the pool's slots."""
        if len(set(keys)) != len(keys):
            raise ValueError("sample_sessions: a session key appears twice in one call")
        if len(keys) * n > self.slots:
            raise PoolFull(f"a batch of {len(keys)} sessions x {n} candidates does not fit a pool of {self.slots} "
                           f"slots ({self.nbytes / 2**20:.1f} MiB); build the policy with session_slots >= batch x "
                           "n_candidates (the rollout's batch_size x n_candidates)")
        keep = keep if keep is not None else [None] * len(keys)
        mine = {}
        for k, s in zip(keys, keep):
            own = [b[0] for b in self.branches.get(k, ()) if b[0] != s]
            mine[k] = ([] if s is None else [s]) + own[:n - (s is not None)]
        taken = {s for own in mine.values() for s in own}
        taken |= {b[0] for k, bs in self.branches.items() if k not in mine for b in bs}
        free = sorted(set(range(self.slots)) - taken, reverse=True)
        out = []
        for k in keys:
            own = mine[k]
            while len(own) < n:
                if not free:
                    victim = next(v for v in self.used if v not in mine)
                    free = sorted(free + [b[0] for b in self.branches[victim]], reverse=True)
                    self.release([victim])
                    self.stats["evicted"] += 1
                own.append(free.pop())
            self.branches[k] = [(s, []) for s in own]
            self.used.pop(k, None)
            self.used[k] = True
            out.append(own)
        return out


# ---- device side ---------------------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnums=(3, 4))
def gather_rows(kv: dict, slots, kept, m: int, size: int) -> dict:
    """A batch cache of `size` slots: row b holds pool slot slots[b]'s first kept[b] tokens at slots
    [m - kept[b], m) (right-aligned), nothing valid elsewhere; index m."""
    j = jnp.arange(size)
    src = j[None, :] - (m - kept[:, None])                        # [B,size]: pool slot each batch slot reads
    valid = (src >= 0) & (src < kept[:, None])
    src = jnp.clip(src, 0, kv["k"][0].shape[2] - 1)
    pick = lambda bufs: tuple(take_slots(b[slots], src) for b in bufs)
    return {"k": pick(kv["k"]), "v": pick(kv["v"]), "valid": valid, "index": jnp.asarray(m, jnp.int32)}


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(5,))
def extend(cfg: ModelConfig, params, tokens, positions, token_valid, cache):
    """`forward_cached` of the appended tokens [B,T] -> (last-column logits [B,V], cache)."""
    hidden, cache = forward_cached_hidden(cfg, params, tokens, positions, token_valid, cache)
    return logits_from_hidden(cfg, params, hidden[:, -1]), cache


@functools.partial(jax.jit, static_argnums=(5, 6, 7), donate_argnums=(0,))
def store_rows(kv: dict, cache: dict, slots, kept, appended, M: int, T: int, N: int):
    """Each batch row's tokens written left-aligned, in order, into pool slot slots[b] (a slot >= the pool's rows
    marks a row not stored: padding, or a candidate no branch continues). A row's layout in the batch cache: its kept
    tokens kept[b] right-aligned before slot M, its appended ones appended[b] right-aligned before M + T (left
    padding before them), its N decoded slots from M + T on (a cascade cache, generate.cascade_cache, rows
    [u*m, (u+1)*m) continuing prefix row u: the prefix's M + T slots, then the row's own N). The kept and appended
    runs are compacted by one gather per PREFIX row (once per group under the cascade, not once per decode row),
    then each pool row takes two windows in place: the compacted prompt from slot 0, the decoded slots from
    kept + appended. No start is ever clamped: the first is 0, the second fits because a session holds at most
    the pool's max_len (sample_sessions checks prompt + N first). What follows the held tokens (a compacted row's
    padding, tokens past a stop-string cut) is never read: the session's held ids say how many tokens the row
    holds."""
    shared = cache.get("prefix")
    P = kv["k"][0].shape[2]
    src = shared or cache   # the prompt's slots [0, M + T): the prefix rows', or every row's own
    rows = src["valid"].shape[0]
    m = cache["valid"].shape[0] // rows
    own0 = 0 if shared else M + T   # where a row's decoded slots start in its own buffers
    j = jnp.arange(min(M + T, P))[None]   # the pool row's first slots: the compacted prompt
    k_, a_ = kept[::m][:rows, None], appended[::m][:rows, None]   # a group's rows share their prompt's counts
    idx = jnp.clip(jnp.where(j < k_, M - k_ + j, M + T - a_ - k_ + j), 0, M + T - 1)   # slot j's source slot
    prompt = tuple(take_slots(b, idx) for b in src["k"] + src["v"])   # [rows, K, min(M + T, P), Dh]

    stored = slots < kv["k"][0].shape[0]
    order = jnp.argsort(~stored, stable=True)   # the rows to store first, in order

    def copy_row(i, bufs):
        out, r = [], order[i]
        for pool, pre, own in zip(bufs, prompt, cache["k"] + cache["v"]):
            pool = jax.lax.dynamic_update_slice(pool, pre[r // m][None], (slots[r], 0, 0, 0))
            if N:
                dec = jax.lax.dynamic_slice_in_dim(own[r], own0, N, axis=1)   # [K,N,Dh]
                pool = jax.lax.dynamic_update_slice(pool, dec[None], (slots[r], 0, kept[r] + appended[r], 0))
            out.append(pool)
        return tuple(out)

    bufs = jax.lax.fori_loop(0, jnp.sum(stored), copy_row, kv["k"] + kv["v"])
    L = len(kv["k"])
    return {"k": bufs[:L], "v": bufs[L:]}


# ---- host side -----------------------------------------------------------------------------------------------
def fine_bucket(n: int, minimum: int = 16) -> int:
    """n rounded up to a multiple of an eighth of its power-of-two bucket (at least `minimum`): the reuse path's
    cache lengths, whose every slot costs attention work on each appended and generated token (at most 8 compiled
    shapes per octave instead of 1, for at most 1/8 of padding instead of up to 1/2)."""
    step = max(minimum, bucket(n, minimum) // 8)
    return -(-n // step) * step


def prefill_into_pool(cfg: ModelConfig, params, pool: SessionPool, slots: Sequence[int],
                      prompts: Sequence[Sequence[int]]):
    """Whole prompts prefilled (generate's prefill) and stored into their pool slots: (last-column logits
    [bucket(n),V], token slots computed)."""
    n_pad, T = bucket(len(prompts), 1), fine_bucket(max(len(p) for p in prompts))
    tokens, positions, valid = left_pad(prompts, n_pad, T)
    cache = init_cache(cfg, n_pad, T)
    logits, cache = _prefill(cfg, params, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(valid), cache)
    rows = np.full(n_pad, pool.slots, np.int32)
    rows[:len(slots)] = slots
    lengths = np.zeros(n_pad, np.int32)
    lengths[:len(prompts)] = [len(p) for p in prompts]
    pool._kv = store_rows(pool._kv, cache, jnp.asarray(rows), jnp.asarray(lengths), jnp.zeros(n_pad, jnp.int32),
                          T, 0, 0)
    return logits, n_pad * T


def sample_sessions(cfg: ModelConfig, params, pool: SessionPool, keys: Sequence[Hashable],
                    prompts: Sequence[Sequence[int]], sp: SamplingParams, key: jax.Array,
                    stop_strings: Sequence[str] | None = None, tokenizer=None, chunk: int | None = None, *,
                    n: int = 1, cascade: bool = True) -> Completions:
    """n completions per prompt, rows i*n .. i*n+n-1 prompt i's (as `generate.sample`); prompt i continues a branch
    of session keys[i] and the n rows become its n branches (see the module doc). Decode row r samples with
    fold_in(key, r), as `generate.sample`, so results match the full-prefill path row for row. cascade (n > 1): the
    n rows read their prompt's cache once per group (generate.cascade_cache) instead of a copy each."""
    B, N = len(prompts), sp.max_new_tokens
    if n < 1:
        raise ValueError(f"sample_sessions: n={n}; need n >= 1")
    if B == 0:
        return Completions(np.zeros((0, N), np.int32), np.zeros((0, N), np.float32), np.zeros(0, np.int32), [])
    if any(len(p) == 0 for p in prompts):
        raise ValueError("sample_sessions: every prompt needs at least one token (add a BOS token)")
    if stop_strings and tokenizer is None:
        raise ValueError("sample_sessions: stop_strings need a tokenizer to detokenize")
    too_long = max(len(p) for p in prompts)
    if too_long + N > pool.max_len:
        raise PoolFull(f"a session of {too_long} prompt + {N} new tokens does not fit the pool's {pool.max_len} "
                       "tokens per slot; build the policy with a larger session_tokens (or a shorter prompt budget)")
    t0 = time.perf_counter()
    picked = [pool.pick(k, p) for k, p in zip(keys, prompts)]   # (slot, kept) of the branch each prompt continues
    held = [any(h for _, h in pool.branches.get(k, ())) for k in keys]
    partial = [0 < kept < len(dict(pool.branches.get(k, ())).get(s, ())) for k, (s, kept) in zip(keys, picked)]
    slots = pool.assign(list(keys), n, [s for s, _ in picked])   # [B][n]: the reused branch's slot first
    # the last call's deferred store, but for the slots this call's candidates are about to overwrite
    pool.flush(skip=[s for (p, _), own in zip(picked, slots) for s in own if s != p])
    kept = [k for _, k in picked]
    for k, h, part in zip(kept, held, partial):   # counted once the call fits (assign resets the held ids)
        pool.stats["reused" if k else ("fallback_not_prefix" if h else "fallback_new")] += 1
        pool.stats["reused_partial"] += part
    appended = [list(p[k:]) for p, k in zip(prompts, kept)]
    pool.stats["reused_tokens"] += sum(kept)
    pool.stats["appended_tokens"] += sum(len(a) for a in appended)
    B_pad, R = bucket(B, 1), B * n
    shared = cascade and n > 1   # the decode cache: each prompt's own (the cascade: no slots for the new tokens)
    src = np.zeros(B_pad, np.int32)     # the pool slot each prompt row is gathered from (padding rows: none kept)
    src[:B] = [s[0] for s in slots]
    kept_pad = np.zeros(B_pad, np.int32)
    kept_pad[:B] = kept
    if not any(kept):   # every row new: generate.sample's own prefill (the first turn is the plain path, bit for bit)
        T = bucket(max(len(a) for a in appended), 16)
        if T + N > cfg.max_seq_len:
            T = max(cfg.max_seq_len - N, max(len(a) for a in appended))
        tokens, positions, valid = left_pad(appended, B_pad, T)
        cache = init_cache(cfg, B_pad, T if shared else T + N)
        logits, cache = _prefill(cfg, params, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(valid), cache)
        prefilled, M, T = B_pad * T, T, 0   # the layout store_rows reads: prompts before M = T, no appended block
        app_len = np.zeros(B_pad, np.int32)
        kept_pad[:B] = [len(a) for a in appended]
    else:
        fresh = [i for i in range(B) if kept[i] == 0]
        prefilled = 0
        if fresh:   # their own prefill pass (a whole prompt must not widen every row's appended block), into the pool
            logits_new, prefilled = prefill_into_pool(cfg, params, pool, [src[i] for i in fresh],
                                                      [appended[i] for i in fresh])
            for i in fresh:
                kept_pad[i], appended[i] = len(appended[i]), []
        T, M = fine_bucket(max(len(a) for a in appended)), fine_bucket(int(kept_pad.max()))
        app_len = np.zeros(B_pad, np.int32)
        app_len[:B] = [len(a) for a in appended]
        tokens, positions, valid = left_pad(appended, B_pad, T)
        positions = positions + kept_pad[:, None]
        # a copy: this call's store (deferred to the next call) overwrites the reused branch's slot only after this
        size = M + T if shared else fine_bucket(M + T) + N
        cache = gather_rows(pool._kv, jnp.asarray(src), jnp.asarray(kept_pad), M, size)
        logits, cache = extend(cfg, params, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(valid), cache)
        if fresh:
            logits = logits.at[jnp.asarray(fresh)].set(logits_new[:len(fresh)])
        prefilled += B_pad * T
    position = jnp.asarray(kept_pad + app_len, jnp.int32)
    if shared:   # each prompt's cache (computed once) read by its n decode rows, as generate.sample's cascade
        logits, position, cache = cascade_cache(cfg, cache, logits, position, n, N)
    elif n > 1:   # each prompt's cache (computed once) copied to its n decode rows, as generate.sample's share_prefix
        rows = np.zeros(bucket(R, 1), np.int32)
        rows[:R] = np.arange(R) // n
        logits, cache, position = _fork((logits, cache, position), rows)
    jax.block_until_ready(logits)
    t1, R_pad = time.perf_counter(), logits.shape[0]
    out, cache = decode(cfg, params, cache, logits, position, R, sp, key, stop_strings, tokenizer, chunk)
    dest = np.full(R_pad, pool.slots, np.int32)   # decode row i*n+j -> branch j of key i; padding rows: never stored
    dest[:R] = np.asarray(slots).reshape(-1)
    prompt_of = np.minimum(np.arange(R_pad) // n, B_pad - 1)
    pool.defer(cache, dest, jnp.asarray(kept_pad[prompt_of]), jnp.asarray(app_len[prompt_of]), M, T, N)
    for i, k in enumerate(keys):
        pool.branches[k] = [(s, list(prompts[i]) + out.tokens[i * n + j, :out.lengths[i * n + j]].tolist())
                            for j, s in enumerate(slots[i])]
    out.prefill_tokens = prefilled
    out.timing.update(prefill_s=t1 - t0, decode_s=time.perf_counter() - t1)
    return out
