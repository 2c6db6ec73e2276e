"""Continuous batching: a fixed pool of decode slots over one KV cache; a finished row's slot takes the next request.

`SlotPool` is the pool's host side (request queues, slots, sessions, scheduling); the jitted operations on its cache
(insert, place, extend_rows, extend_branches, stash, forget, shift) are in slot_cache.py. A sample depends only on
its request's key and fold, not on its slot, batch or arrival order; at temperature 0 a request's tokens are the
lock-step sampler's. docs/continuous_batching.md describes the cache layout, shared prefixes, sessions (parked rows
and branches) and the prefix cache.
"""
from __future__ import annotations

import collections
import dataclasses
import time
from typing import Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrag.models.config import ModelConfig
from jaxrag.models.transformer import init_cache
from jaxrag.sampling.generate import (SamplingParams, _decode_chunk, _first_stop, _prefill, bucket, finish_row,
                                      left_pad, on_params_mesh, params_mesh, stop_ids_of)
from jaxrag.sampling.sessions import MIN_SHARED, fine_bucket, shared_prefix
from jaxrag.sampling.slot_cache import (extend_branches, extend_rows, forget, insert, insert_shared, place,
                                        place_shared, shift, stash)


_CACHED = "cached row"   # a cached row's session key is (_CACHED, its slot)


def _cached(key: Hashable) -> bool:
    return isinstance(key, tuple) and len(key) == 2 and key[0] is _CACHED


class RequestTooLong(ValueError):
    """A request whose prompt + max_new_tokens exceeds the pool's tokens per slot."""


@dataclasses.dataclass
class Finished:
    rid: Hashable
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str          # "eos" | "stop" | "length"
    prompt_ids: list[int]


@dataclasses.dataclass
class _Request:
    rid: Hashable
    ids: list[int]
    fold: tuple[int, int]
    session: Hashable | None = None


# ---- host side ---------------------------------------------------------------------------------------------
def _extension(kept: list[int], appended: list[list[int]]):
    """Inputs of extending rows that keep kept[i] ids by appended[i] (`extend_rows`, `extend_branches`): (A, the
    appended ids' padded length; M, the kept ids' bucket; (kept [n], tokens, positions, valid [n,A]) device arrays,
    positions continuing each row's kept ids)."""
    A, M = fine_bucket(max(map(len, appended))), bucket(max(kept), 16)
    tokens, positions, valid = left_pad(appended, len(appended), A)
    held = np.asarray(kept, np.int32)
    return A, M, (jnp.asarray(held), jnp.asarray(tokens), jnp.asarray(positions + held[:, None]), jnp.asarray(valid))


class SlotPool:
    """B decode slots over one cache of T tokens per slot (+ `chunk` slots of headroom; docs/continuous_batching.md).
    With group=m > 1: B/m groups of m slots over prefix rows of T - max_new_tokens tokens, each slot's own cache
    max_new_tokens + chunk tokens (docs/continuous_batching.md, "Shared prefixes").

    stats: chunks, slot_steps (slots x decode steps run), busy_steps (steps a slot held a live row: the tokens
    generated), prefill_tokens (token slots the inserts computed), prefill_shared (requests served by another
    request's prefill: same prompt ids in one insert, or a continued row's copies), inserts, shifts (_left / _right),
    finished; with sessions: reused (requests that continued a parked row, or a copy of one; reused_partial: of
    them, those that kept a common prefix shorter than the row's held ids; reused_cached: those that forked from a
    cached row; dropped_cached: cached rows evicted), continued_inserts,
    reused_tokens (held ids not prefilled again, per request), appended_tokens (ids the session requests prefilled,
    once per prefill: appended ones, whole prompts on a fallback), fallback_new /
    _not_prefix / _evicted, evicted (_slot / _span); timing: insert_s (host prep + dispatch of the inserts, and the
    wait for their prefill / place to finish: `collect` waits for the last `place` output first, as the device runs
    the inserts before the chunk), decode_s (dispatch + the rest of the wait: the chunk), host_s (stop strings,
    results). Without that split every insert's device time fell into decode_s (dispatch is asynchronous): at batch
    32 of benchmarks.rollout --kv 70% of the pool's reported decode time was its prefill. idle_share = 1 - busy /
    slot steps."""

    def __init__(self, cfg: ModelConfig, params, slots: int, max_len: int, sp: SamplingParams, key: jax.Array,
                 stop_strings: Sequence[str] | None = None, tokenizer=None, chunk: int = 16,
                 refill: float = 0.25, setting: str = "max_len", sessions: bool = False,
                 min_shared: int = MIN_SHARED, prefix_cache: bool = False, group: int = 1):
        if slots < 1 or max_len < 1 or chunk < 1 or group < 1:
            raise ValueError(f"SlotPool: slots={slots}, max_len={max_len}, chunk={chunk}, group={group}; each must "
                             "be >= 1")
        if group > 1 and (slots % group or prefix_cache):
            raise ValueError(f"SlotPool(group={group}): slots ({slots}) must be a multiple of the group, and a pool of "
                             "shared prefixes keeps no prefix cache (prefix_cache=True needs group=1)")
        if stop_strings and tokenizer is None:
            raise ValueError("SlotPool: stop_strings need a tokenizer to detokenize")
        if prefix_cache and not sessions:
            raise ValueError("SlotPool(prefix_cache=True) keeps released sessions' rows: build it with sessions=True")
        if sp.max_new_tokens >= max_len:
            raise RequestTooLong(f"max_new_tokens={sp.max_new_tokens} leaves no room for a prompt in the slot pool's "
                                 f"{max_len} tokens per slot; raise {setting}")
        self.cfg, self.params, self.sp, self.chunk, self.setting = cfg, params, sp, chunk, setting
        # rows done (groups done, in a pool of shared prefixes) that end a chunk
        self.refill = 0 if refill <= 0 else max(1, int(np.ceil(refill * slots / group)))
        self.slots, self.max_len, self.base_key = slots, max_len, key
        self.stop_strings, self.tokenizer = list(stop_strings or []), tokenizer
        self.true_eos, self.stop_ids = stop_ids_of(cfg, sp, tokenizer)
        B, N, S = slots, sp.max_new_tokens, max_len + chunk
        self.group = group
        if group > 1:   # a row's own slots hold only its new tokens; its prompt lies once in its group's prefix row
            S, shared = N + chunk, init_cache(cfg, slots // group, max_len - N)
        self.cache = init_cache(cfg, B, S)
        if group > 1:
            self.cache["prefix"] = {"k": shared["k"], "v": shared["v"], "valid": shared["valid"]}
        self.store = None   # sessions in a pool of shared prefixes: each slot's last completion, kept when it parks
        if group > 1 and sessions:
            store = init_cache(cfg, B, N)
            self.store = {"k": store["k"], "v": store["v"], "valid": store["valid"]}
        self.state = {"logits": jnp.zeros((B, cfg.vocab_size), jnp.float32), "tokens": jnp.zeros((B, N), jnp.int32),
                      "logprobs": jnp.zeros((B, N), jnp.float32), "lengths": jnp.zeros((B,), jnp.int32),
                      "position": jnp.zeros((B,), jnp.int32), "done": jnp.ones((B,), bool),
                      "stopped": jnp.zeros((B,), bool), "t": jnp.zeros((), jnp.int32),
                      "exit_done": jnp.asarray(B, jnp.int32)}
        self.keys = jax.vmap(lambda r: jax.random.fold_in(key, r))(jnp.arange(B))   # placeholders until an insert
        self.index, self.t = 0, 0                       # host mirrors of cache["index"] and state["t"]
        self.owner: list[_Request | None] = [None] * B
        self.start = np.zeros(B, np.int64)              # first cache slot of each row's prompt
        self.checked = np.zeros(B, np.int64)            # tokens already checked for stop strings
        self.seen = np.zeros(B, np.int64)               # each row's length at the last collect
        self.queue: collections.deque[_Request] = collections.deque()
        self.sessions, self.min_shared, self.prefix_cache = sessions, min_shared, prefix_cache
        self.parked: dict[Hashable, list[int]] = {}     # session key -> its parked slots (its last turn's
                                                        # candidates: branches), oldest parked key first
        self.turn: dict[Hashable, list[int]] = {}       # session key -> the prompt ids its parked branches answered
        self.park: list[Hashable | None] = [None] * B   # the session parked in each slot
        self.held: list[list[int]] = [[] for _ in range(B)]   # the ids a parked row holds (prompt + completion)
        self.evicted: set = set()                       # sessions evicted and not released since
        self.released: set = set()                      # sessions released while a request of theirs was in flight
        self.launched = False
        self.placed = None    # an output of the last insert's `place` not yet waited for (collect times it first)
        self.stats = collections.Counter()
        self.timing = {"insert_s": 0.0, "decode_s": 0.0, "host_s": 0.0}

    @property
    def nbytes(self) -> int:
        pre = self.cache.get("prefix", {"k": (), "v": ()})
        store = self.store or {"k": (), "v": ()}
        return sum(int(b.nbytes) for b in self.cache["k"] + self.cache["v"] + pre["k"] + pre["v"] + store["k"]
                   + store["v"])

    @property
    def busy(self) -> int:
        """Requests held: queued or in a slot."""
        return len(self.queue) + sum(o is not None for o in self.owner)

    @property
    def idle_share(self) -> float:
        return 1.0 - self.stats["busy_steps"] / max(self.stats["slot_steps"], 1)

    def submit(self, rid: Hashable, ids: Sequence[int], fold: tuple[int, int], session: Hashable | None = None) -> None:
        """Queue a prompt (token ids) under request id `rid`; its key folds in `fold` (two ints). session (a pool
        built with sessions=True): the key whose parked row this request continues, and where it parks when done."""
        if session is not None and not self.sessions:
            raise ValueError("SlotPool.submit(session=...): build the pool with sessions=True")
        if not len(ids):
            raise ValueError("SlotPool.submit: a prompt needs at least one token (add a BOS token)")
        if len(ids) + self.sp.max_new_tokens > self.max_len:
            raise RequestTooLong(f"a request of {len(ids)} prompt + {self.sp.max_new_tokens} new tokens does not fit "
                                 f"the slot pool's {self.max_len} tokens per slot; raise {self.setting} (or shorten "
                                 "the prompt budget)")
        self.queue.append(_Request(rid, list(ids), (int(fold[0]), int(fold[1])), session))
        self.released.discard(session)

    def release(self, keys: Sequence[Hashable]) -> None:
        """Free the slots of sessions `keys` (finished episodes). A session whose request is still queued or
        decoding does not park when it finishes (unless the key is submitted again first)."""
        live = self._in_flight()
        for k in keys:
            for b in list(self.parked.get(k, ())):
                self._uncache(b) if self.prefix_cache else self._unpark(b)
            if k in live:
                self.released.add(k)
            self.evicted.discard(k)

    def _in_flight(self) -> set:
        """The sessions with a request queued or in a slot."""
        return {r.session for r in self.queue} | {o.session for o in self.owner if o is not None}

    def _unpark(self, b: int) -> None:
        k = self.park[b]
        self.parked[k].remove(b)
        if not self.parked[k]:
            del self.parked[k], self.turn[k]
        self.park[b], self.held[b] = None, []

    def _parked_slots(self) -> list[int]:
        return [b for b, k in enumerate(self.park) if k is not None]

    def _uncache(self, b: int) -> None:
        """Slot b's parked row leaves its session and stays as a CACHED row (prefix_cache): parked under a key of
        its own, newest last, that no request continues; a new request may fork from it (`_admit`)."""
        ids, prompt = self.held[b], self.turn[self.park[b]]
        self._unpark(b)
        self._park(b, (_CACHED, b), prompt, ids)

    def _cached_slots(self) -> list[int]:
        """The cached rows' slots, least recently used first."""
        return [bs[0] for k, bs in self.parked.items() if _cached(k)]

    def _evict(self, b: int, why: str) -> None:
        """Slot b's parked row gives up its slot: a session's (counted in evicted, evicted_<why>; its next request
        is a fallback_evicted) or a cached row (counted in dropped_cached)."""
        if _cached(self.park[b]):
            self.stats["dropped_cached"] += 1
        else:
            self.evicted.add(self.park[b])
            self.stats["evicted"] += 1
            self.stats[f"evicted_{why}"] += 1
        self._unpark(b)

    def _park(self, b: int, key: Hashable, prompt: list[int], ids: list[int]) -> None:
        """Slot b's row parks as a branch of session `key`: the rows of one turn (its candidates, same prompt) park
        side by side; a row of another turn (a request sent before the last one finished) replaces them."""
        if key in self.parked and self.turn[key] != prompt:
            for old in list(self.parked[key]):
                self._unpark(old)
        self.parked.setdefault(key, []).append(b)
        self.turn[key], self.park[b], self.held[b] = prompt, key, ids
        self.evicted.discard(key)

    def _shift(self, d: int) -> None:
        self.cache = shift(self.cache, jnp.asarray(d, jnp.int32))
        self.index += d
        self.start += d
        self.stats["shifts"] += 1
        self.stats["shifts_right" if d > 0 else "shifts_left"] += 1

    def _admit(self) -> tuple[list[tuple[int, _Request]], list[tuple[int, int, list]]]:
        """Waiting requests out of the queue, in order: (fresh: (free slot, request) to prefill in full, continued:
        [(source slot, ids kept, [(slot, request), ...])]: rows whose other ids alone are prefilled, once, and
        copied to each of their requests' slots). A request continues the branch of its session (the parked rows of
        the session's last turn: one per candidate) that keeps the most of its ids (sessions.shared_prefix: one
        whose held ids it extends, else the longest common prefix of at least min_shared ids and a quarter of the
        prompt, counted in reused_partial), into that branch's own slot; the session's other branches are freed
        (the episode went on from that one), and the requests after it with the same session and ids (the turn's
        other candidates) take free slots as copies of the continued row. With prefix_cache, a request that keeps
        nothing of its own session's rows FORKS from the cached row (a released session's) that keeps the most of
        its ids: into a free slot, the cached row left as it was (reused_cached); requests of one insert with the
        same ids fork once (a group's identical first prompts). A request that keeps nothing is a fallback, counted
        by reason (new / not_prefix / evicted) with its siblings. A request that needs a slot when none is free
        evicts a parked row (`_free_slot`; never a fork's source); with none to evict it waits."""
        free = [b for b, o in enumerate(self.owner) if o is None and self.park[b] is None]
        fresh, wait = [], collections.deque()
        cont: dict[Hashable, tuple[int, int, list]] = {}   # -> (source slot, ids kept, [(slot, request), ...])
        turn: dict[Hashable, tuple] = {}   # session -> (its ids, its continuation's key in cont or None, reason)
        partial: dict[Hashable, bool] = {}  # a continuation -> it keeps fewer ids than its source holds
        sources: set[int] = set()          # cached rows forked from in this insert: not evicted for a slot
        queued = {r.session for r in self.queue}

        for r in self.queue:
            k = r.session
            if k is not None and k in turn and turn[k][0] == r.ids:   # a sibling of a request admitted above
                key, why = turn[k][1:]
            else:
                branches = self.parked.get(k, []) if k is not None else []
                kept, src = max(((shared_prefix(self.held[b], r.ids, self.min_shared), b) for b in branches),
                                default=(0, None))
                key, own = None, False
                why = "not_prefix" if branches else "evicted" if k in self.evicted else "new"
                for b in list(branches):   # the episode goes on from branch src (or from none): free the rest
                    held = len(self.held[b])
                    self._unpark(b)
                    if kept and b == src:   # continued in its own slot
                        key, own = b, True
                        cont[b], partial[b] = (b, kept, [(b, r)]), kept < held
                        self.stats["reused_partial"] += partial[b]
                    else:
                        free.append(b)
                if key is None and self.prefix_cache and k is not None:
                    kept, src = max(((shared_prefix(self.held[b], r.ids, self.min_shared), b)
                                     for b in self._cached_slots()), default=(0, None))
                    if kept:
                        key = ("fork", src, tuple(r.ids))
                        if key not in cont:
                            cont[key], partial[key] = (src, kept, []), kept < len(self.held[src])
                            sources.add(src)
                            self.parked[self.park[src]] = self.parked.pop(self.park[src])   # most recently used
                if k is not None:
                    turn[k] = (r.ids, key, why)
                if own:
                    continue
            b = self._free_slot(free, queued, sources)
            if b is None:
                wait.append(r)
            elif key is not None:
                cont[key][2].append((b, r))
                self.stats["reused_partial"] += partial[key]
                self.stats["reused_cached"] += isinstance(key, tuple)
            else:
                fresh.append((b, r))
                if k is not None:
                    self.stats[f"fallback_{why}"] += 1
                    self.evicted.discard(k)
        self.queue = wait
        return fresh, [c for c in cont.values() if c[2]]

    def _free_slot(self, free: list[int], queued: set, keep: set = frozenset()) -> int | None:
        """A free slot; when none is, a parked row evicted for it: a cached row (least recently used first; not one
        in `keep`), else of the oldest parked session with no request queued, else of the oldest; None when no slot
        can be had."""
        if not free and self.parked:
            cached = [b for b in self._cached_slots() if b not in keep]
            if cached:
                b = cached[0]
            else:
                bs = next((bs for k, bs in self.parked.items() if k not in queued and not _cached(k)),
                          next((bs for k, bs in self.parked.items() if not _cached(k)), None))
                if bs is None:
                    return None
                b = bs[-1]
            self._evict(b, "slot")
            free.append(b)
        return free.pop(0) if free else None

    def _insert(self) -> None:
        """Waiting requests into slots (`_admit`). Requests with identical prompt ids share one prefill row (forked
        to each of their slots on device); the distinct prompts are prefilled in groups of power-of-two sizes (no
        padding rows; a group of n prompts costs n x P tokens, P = its longest prompt's bucket), longest first.
        A group's slot rows are padded to a power of two with dropped rows, so `place` compiles few shapes.
        Continued sessions: `_continue`."""
        if not self.queue:
            return
        if self.group > 1:
            return self._insert_shared()
        fresh, cont = self._admit()
        if not fresh and not cont:
            return
        t0 = time.perf_counter()
        by_prompt: dict[tuple[int, ...], list[tuple[int, _Request]]] = {}
        for b, r in fresh:
            by_prompt.setdefault(tuple(r.ids), []).append((b, r))
        groups, distinct = self._prefix_groups(list(by_prompt)) if self.prefix_cache else ([], list(by_prompt))
        distinct = sorted(distinct, key=len, reverse=True)
        room = self.max_len - self.sp.max_new_tokens    # every prompt fits it (submit); a bucket past it is cut to it
        cont = sorted(cont, key=lambda c: len(c[2][0][1].ids) - c[1], reverse=True)      # most appended first
        P_max = max(min(bucket(len(distinct[0]), 16), room) if distinct else 0,
                    min(self._span(cont), room) if cont else 0,
                    min(self._group_span(groups), room) if groups else 0)
        if self.index < P_max:
            self._shift(P_max - self.index)
        for group, P, (tokens, positions, valid), placed, (rows, slots, folds) in self._parts(distinct, by_prompt,
                                                                                               room):
            self.cache, self.state, self.keys = insert(
                self.cfg, self.params, self.cache, self.state, self.keys, self.base_key, tokens, positions, valid,
                slots, folds, self.sp.max_new_tokens, rows)
            self._inserted(placed, len(group), len(group) * P)
            self.stats["appended_tokens"] += sum(len(ids) for ids in group
                                                 if any(r.session is not None for _, r in by_prompt[ids]))
        if groups:
            self._share_prefixes(groups, by_prompt, room)
        while cont:
            n = 1 << (len(cont).bit_length() - 1)
            group, cont = cont[:n], cont[n:]
            self._continue(group, room)
        self.timing["insert_s"] += time.perf_counter() - t0

    def _insert_shared(self) -> None:
        """`_insert` for a pool of shared prefixes (group m > 1): waiting requests with the same ids fill the m slots
        of one free group (all its slots free; more than m of them take further groups), their prompt written once
        into the group's prefix row; the distinct prompts are prefilled in power-of-two groups, longest first, as
        `_insert` does. A request that finds no free group evicts a parked session's rows (`_free_group`), else
        waits. No shift: a row's own slots start empty. With sessions, a turn that keeps ids of a parked branch is
        continued first (`_admit_groups`, `_continue_groups`)."""
        m, t0 = self.group, time.perf_counter()
        U, room = self.slots // m, self.max_len - self.sp.max_new_tokens
        free = [g for g in range(U) if self._group_free(g)]
        cont, fresh = self._admit_groups(free) if self.sessions else ([], [(r, None) for r in self.queue])
        groups: dict[tuple[int, ...], list[int]] = {}               # prompt -> its groups in this insert
        by_prompt: dict[tuple[int, ...], list[tuple[int, _Request]]] = {}
        wait, queued = collections.deque(), {r.session for r, _ in fresh}
        for r, why in fresh:
            ids, taken = tuple(r.ids), len(by_prompt.get(tuple(r.ids), ()))
            if taken == m * len(groups.get(ids, ())):               # this prompt's groups are full: open one
                g = self._free_group(free, queued)
                if g is None:
                    wait.append(r)
                    continue
                groups.setdefault(ids, []).append(g)
            by_prompt.setdefault(ids, []).append((groups[ids][taken // m] * m + taken % m, r))
            if why is not None:
                self.stats[f"fallback_{why}"] += 1
                self.evicted.discard(r.session)
        self.queue = wait
        cont = sorted(cont, key=lambda c: len(c[4][0][1].ids) - c[3], reverse=True)   # most appended first
        while cont:   # before the fresh prompts: their prefix rows may be ones a continuation reads
            n = 1 << (len(cont).bit_length() - 1)
            part, cont = cont[:n], cont[n:]
            self._continue_groups(part, room)
        distinct = sorted(by_prompt, key=len, reverse=True)
        for part, P, (tokens, positions, valid), placed, (rows, slots, folds) in self._parts(distinct, by_prompt,
                                                                                              room):
            pairs = [(g, u) for u, ids in enumerate(part) for g in groups[ids]]   # (prefix row, prefill row)
            pad = bucket(len(pairs), 1) - len(pairs)
            gs = jnp.asarray([g for g, _ in pairs] + [U] * pad, jnp.int32)
            grows = jnp.asarray([u for _, u in pairs] + [0] * pad, jnp.int32)
            self.cache, self.state, self.keys = insert_shared(
                self.cfg, self.params, self.cache, self.state, self.keys, self.base_key, tokens, positions, valid,
                gs, grows, slots, folds, self.sp.max_new_tokens, rows)
            self._inserted(placed, len(part), len(part) * P)
            self.stats["appended_tokens"] += sum(len(ids) for ids in part
                                                 if any(r.session is not None for _, r in by_prompt[ids]))
        self.timing["insert_s"] += time.perf_counter() - t0

    def _group_slots(self, g: int) -> range:
        return range(g * self.group, (g + 1) * self.group)

    def _group_free(self, g: int) -> bool:
        """Group g takes new work: none of its slots decodes a request or holds a parked row."""
        return all(self.owner[b] is None and self.park[b] is None for b in self._group_slots(g))

    def _free_group(self, free: list[int], queued: set) -> int | None:
        """A free group; when none is, one freed by evicting the parked sessions that hold it: among the groups
        with no row decoding, the one whose sessions are the least needed (each session ranked as `_free_slot` ranks
        them: no request queued before queued, oldest first; a group's rank is its most needed session's). Those
        sessions' rows are evicted wherever they are. None when no group can be had."""
        if not free:
            order = {k: i for i, k in enumerate(self.parked)}
            rank = lambda k: (k in queued, order[k])
            best = None
            for g in range(self.slots // self.group):
                if any(self.owner[b] is not None for b in self._group_slots(g)):
                    continue
                keys = {self.park[b] for b in self._group_slots(g)} - {None}
                if keys and (best is None or max(map(rank, keys)) < best[0]):
                    best = (max(map(rank, keys)), keys)
            if best is None:
                return None
            touched = set()
            for k in best[1]:
                for b in list(self.parked[k]):
                    touched.add(b // self.group)
                    self._evict(b, "slot")
            free.extend(g for g in sorted(touched) if self._group_free(g))
        return free.pop(0)

    def _admit_groups(self, free: list[int]) -> tuple[list[tuple], list[tuple[_Request, str | None]]]:
        """Sessions in a pool of shared prefixes: (continued, fresh). A session's turn continues the parked branch
        that keeps the most of its ids (shared_prefix, as `_admit`): its group's prefix row + the branch's stashed
        completion are extended by the rest of the prompt and written into the prefix row of a TARGET group, whose
        m slots take the turn's requests (continued: [(target, source group, branch slot, ids kept, [(slot,
        request)], kept < held)]). The target is the branch's own group when no other row (decoding, parked, or
        read by another continuation of this insert) holds it, else a group free at the start of the insert; with
        neither, the turn is a full insert. The session's other branches are freed; groups freed here serve only
        the full inserts, which run after the continuations (a continuation may read their prefix rows). Requests
        of a continued turn beyond the group's m are full inserts (fallback_group_full). fresh: (request, fallback
        reason or None) in queue order."""
        m = self.group
        cont: list[list] = []
        turn: dict[Hashable, tuple] = {}   # session -> (its turn's ids, fallback reason or None, its cont entry)
        fresh, sources, later = [], set(), []
        for r in self.queue:
            k = r.session
            if k is None:
                fresh.append((r, None))
                continue
            if k in turn and turn[k][0] == r.ids:   # a sibling of a request admitted above
                c = turn[k][2]
                if c is not None and len(c[4]) < m:
                    c[4].append((c[0] * m + len(c[4]), r))
                else:
                    fresh.append((r, turn[k][1] if c is None else "group_full"))
                continue
            branches = self.parked.get(k, [])
            kept, src = max(((shared_prefix(self.held[b], r.ids, self.min_shared), b) for b in branches),
                            default=(0, None))
            why = "not_prefix" if branches else "evicted" if k in self.evicted else "new"
            held = len(self.held[src]) if src is not None else 0
            touched = {b // m for b in branches}
            for b in list(branches):   # the episode goes on from branch src (or from none): free the rest
                self._unpark(b)
            target = None
            if kept:
                g = src // m
                target = (g if self._group_free(g) and g not in sources
                          else next((f for f in free if f not in sources), None))
            if target is None:
                fresh.append((r, why))
                turn[k] = (r.ids, why, None)
            else:
                if target in free:
                    free.remove(target)
                sources.add(src // m)
                cont.append([target, src // m, src, kept, [(target * m, r)], kept < held])
                turn[k] = (r.ids, None, cont[-1])
            later.extend(g for g in sorted(touched) if g != target and self._group_free(g))
        free.extend(later)
        return cont, fresh

    def _continue_groups(self, part: list[list], room: int) -> None:
        """Continued turns in a pool of shared prefixes (`_admit_groups`' entries): the appended ids of each are
        prefilled once against its branch (`extend_branches`: prefix row + stashed completion), the result written
        into its target group's prefix row and its requests' slots started afresh (`place_shared`)."""
        kept = [c[3] for c in part]
        appended = [c[4][0][1].ids[c[3]:] for c in part]
        A, M, inputs = _extension(kept, appended)
        as_i32 = lambda xs: jnp.asarray(xs, jnp.int32)
        logits, small, small_valid = extend_branches(
            self.cfg, self.params, self.cache["prefix"], self.store, as_i32([c[1] for c in part]),
            as_i32([c[2] for c in part]), *inputs, M, min(M + A, room))
        placed = [(u, b, r) for u, c in enumerate(part) for b, r in c[4]]
        rows, slots, folds = self._pad_rows(placed)
        self.cache, self.state, self.keys = place_shared(
            self.cache, self.state, self.keys, self.base_key, logits, small, small_valid, as_i32([c[0] for c in part]),
            as_i32(range(len(part))), slots, folds, rows)
        self._continued(placed, kept, appended, A)
        self.stats["reused_partial"] += sum(part[u][5] for u, _, _ in placed)

    def _parts(self, distinct: list[tuple[int, ...]], by_prompt: dict, room: int):
        """The distinct new prompts (longest first) in power-of-two parts to prefill, each as (part, its padded
        length P, (tokens, positions, valid) device arrays [n,P], placed: [(prefill row, slot, request)], the
        (rows, slots, folds) `place` takes)."""
        while distinct:
            n = 1 << (len(distinct).bit_length() - 1)
            part, distinct = distinct[:n], distinct[n:]
            P = min(bucket(len(part[0]), 16), room)
            placed = [(u, b, r) for u, ids in enumerate(part) for b, r in by_prompt[ids]]
            yield part, P, tuple(map(jnp.asarray, left_pad(part, n, P))), placed, self._pad_rows(placed)

    def _prefix_groups(self, prompts: list[tuple[int, ...]]) -> tuple[list[tuple[int, list]], list[tuple[int, ...]]]:
        """(groups, the rest): runs of the sorted distinct prompts whose common prefix c keeps at least min_shared
        ids and a quarter of every member (shared_prefix's rule; none with min_shared 0), each member appending at
        least one id: [(c, members)]."""
        if self.min_shared <= 0 or len(prompts) < 2:
            return [], prompts
        groups, rest = [], []
        order = sorted(prompts)
        run, c = [order[0]], len(order[0])

        def close():
            (groups.append((c, list(run))) if len(run) > 1 else rest.extend(run))

        for p in order[1:]:
            lcp = next((i for i, (a, b) in enumerate(zip(run[0], p)) if a != b), min(len(run[0]), len(p)))
            keep = min(lcp, c, min(len(x) for x in run) - 1, len(p) - 1)   # sorted: run[0] vs p bounds the run's
            if keep >= self.min_shared and 4 * keep >= max(len(p), *map(len, run)):
                run.append(p)
                c = keep
            else:
                close()
                run, c = [p], len(p)
        close()
        return groups, rest

    @staticmethod
    def _group_span(groups: list[tuple[int, list]]) -> int:
        """Cache slots the rows of shared-prefix groups are built in: the prefix's bucket + the rests' bucket."""
        return bucket(max(c for c, _ in groups), 16) + fine_bucket(max(len(p) - c for c, ms in groups for p in ms))

    def _share_prefixes(self, groups: list[tuple[int, list]], by_prompt: dict, room: int) -> None:
        """Shared-prefix groups of one insert: every group's prefix prefilled once (generate's prefill, one row a
        group), then each member's rest against its group's prefix (`extend_rows` over that small cache, the same
        pass a fork from a cached row runs) and written by `place` into its requests' slots."""
        heads = [ms[0][:c] for c, ms in groups]
        n, H = bucket(len(heads), 1), min(bucket(max(map(len, heads)), 16), room)   # as insert's prefill
        tokens, positions, valid = left_pad(heads, n, H)
        small = init_cache(self.cfg, n, H + self.sp.max_new_tokens, self.cache["k"][0].dtype)
        _, small = _prefill(self.cfg, self.params, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(valid),
                            small)
        self.stats["prefill_tokens"] += n * H
        rest = [(g, c, p) for g, (c, ms) in enumerate(groups) for p in ms]
        while rest:
            m = 1 << (len(rest).bit_length() - 1)
            part, rest = rest[:m], rest[m:]
            tails = [p[c:] for _, c, p in part]
            placed = [(u, b, r) for u, (_, _, p) in enumerate(part) for b, r in by_prompt[p]]
            A = self._extend_into_slots(small, [g for g, _, _ in part], [c for _, c, _ in part], tails, placed, room)
            self._inserted(placed, m, m * A)
            self.stats["prefix_shared"] += m
            self.stats["prefix_shared_tokens"] += sum(c for _, c, _ in part)
            self.stats["appended_tokens"] += sum(len(t) for t, (_, _, p) in zip(tails, part)
                                                 if any(r.session is not None for _, r in by_prompt[p]))
        self.stats["prefix_shared_tokens"] -= sum(c for c, _ in groups)   # each prefix is prefilled once
        self.stats["appended_tokens"] += sum(c for c, ms in groups
                                             if any(r.session is not None for p in ms for _, r in by_prompt[p]))

    @staticmethod
    def _span(cont: list[tuple[int, int, list]]) -> int:
        """Cache slots a group of continued rows is built in: the held ids' bucket + the appended ids' bucket."""
        return (bucket(max(held for _, held, _ in cont), 16)
                + fine_bucket(max(len(members[0][1].ids) - held for _, held, members in cont)))

    def _continue(self, group: list[tuple[int, int, list]], room: int) -> None:
        """Parked rows continued ((parked slot, held length, [(slot, request), ...]) each; `extend_rows`: the
        appended ids prefilled once against the row's kept keys/values, then the row compacted) and written by
        `place` into the slots of their requests (a fresh sampler state, each request's key): the parked slot
        itself, and for a turn of N candidates N - 1 more, copies forked on device by `place`, as the full
        insert shares one prefill. A row then holds exactly its prompt's len(ids) tokens, as after a full prefill."""
        held = [h for _, h, _ in group]
        appended = [members[0][1].ids[h:] for _, h, members in group]
        placed = [(u, b, r) for u, (_, _, members) in enumerate(group) for b, r in members]   # (row, slot, request)
        A = self._extend_into_slots(self.cache, [src for src, _, _ in group], held, appended, placed, room)
        self._continued(placed, held, appended, A)

    def _continued(self, placed: list[tuple[int, int, _Request]], kept, appended: list, A: int) -> None:
        """Bookkeeping after continued rows were written (`place` / `place_shared`) into the slots of `placed`
        (continued row, slot, request): row u kept kept[u] ids and prefilled appended[u], padded to A."""
        for u, b, r in placed:
            self._taken(b, r)
            self.stats["reused_tokens"] += int(kept[u])
        self.placed = self.keys
        self.stats["continued_inserts"] += 1
        self.stats["prefill_tokens"] += len(appended) * A
        self.stats["reused"] += len(placed)
        self.stats["prefill_shared"] += len(placed) - len(appended)
        self.stats["appended_tokens"] += sum(map(len, appended))

    def _extend_into_slots(self, source: dict, rows: list[int], held: list[int], appended: list, placed: list,
                           room: int) -> int:
        """Rows `rows` of the cache `source` (the pool's parked rows, or a small cache of prefilled heads), each
        keeping its first held[i] valid ids and extended by appended[i] (`extend_rows`: prefilled once against the
        kept keys/values, then compacted), written by `place` into the slots of `placed` (row index, slot,
        request) with a fresh sampler state and each request's key. Returns the appended ids' padded length."""
        A, M, inputs = _extension(held, appended)
        logits, small, small_valid = extend_rows(self.cfg, self.params, source, jnp.asarray(rows, jnp.int32), *inputs,
                                                 M, min(M + A, room))
        index, slots, folds = self._pad_rows(placed)
        self.cache, self.state, self.keys = place(self.cache, self.state, self.keys, self.base_key, logits, small,
                                                  small_valid, slots, folds, index)
        return A

    def _inserted(self, placed: list[tuple[int, int, _Request]], n: int, prefilled: int) -> None:
        """Bookkeeping after `place` wrote n prefilled rows (`prefilled` token slots computed) into the slots of
        `placed` (prefill row, slot, request): the slots taken, the keys current, the insert counted."""
        for _, b, r in placed:
            self._taken(b, r)
        self.placed = self.keys
        self.stats["inserts"] += 1
        self.stats["prefill_tokens"] += prefilled
        self.stats["prefill_shared"] += len(placed) - n

    def _pad_rows(self, placed: list[tuple[int, int, _Request]]):
        """(rows, slots, folds) device arrays for `place` from (prefilled row, slot, request) triples, padded to a
        power of two (few compiled shapes) with rows whose slot, the pool's size, is dropped."""
        pad = bucket(len(placed), 1) - len(placed)
        rows = [u for u, _, _ in placed] + [0] * pad
        slots = [b for _, b, _ in placed] + [self.slots] * pad
        folds = [r.fold for _, _, r in placed] + [(0, 0)] * pad
        return jnp.asarray(rows, jnp.int32), jnp.asarray(slots, jnp.int32), jnp.asarray(folds, jnp.int32)

    def _taken(self, b: int, r: _Request) -> None:
        """Slot b now decodes request r (its len(r.ids) tokens right-aligned before the index; in a pool of shared
        prefixes, its group's prefix row, and its own slots start at the index)."""
        start = self.index - (len(r.ids) if self.group == 1 else 0)
        self.owner[b], self.start[b], self.checked[b], self.seen[b] = r, start, 0, 0

    def launch(self) -> bool:
        """Insert waiting requests into free slots and dispatch one decode chunk (not waited for: the host may work
        while it runs). False when no slot holds a request (nothing dispatched)."""
        if self.launched:
            raise RuntimeError("SlotPool.launch: collect() the running chunk first")
        self._insert()
        held = [b for b, o in enumerate(self.owner) if o is not None]
        if not held:
            return False
        need = self.index + self.chunk - self.cache["valid"].shape[1]
        if need > 0:   # no room for a whole chunk: shift left by the oldest row's start, parked rows included
            parked = self._parked_slots() if self.store is None else []   # (stashed: their own slots not read)
            for b in [b for b in parked if self.start[b] < need]:
                self._evict(b, "span")   # parked so long that its row spans more than T: rolled out otherwise
            self._shift(-int(min(self.start[b] for b in held + (self._parked_slots() if self.store is None else []))))
        t0 = time.perf_counter()
        if self.refill:   # counted in groups: a group's slots serve a new prompt only once all of them are free
            units, busy = self.slots // self.group, len({b // self.group for b in held})
            self.state["exit_done"] = jnp.asarray(min(units, units - busy + self.refill), jnp.int32)
        (self.cache, self.state, self.keys), self.stop_ids = on_params_mesh(
            self.params, (self.cache, self.state, self.keys), self.stop_ids)
        self.cache, self.state = _decode_chunk(self.cfg, self.sp, self.chunk, self.params, self.cache, self.state,
                                               self.stop_ids, self.keys, mesh=params_mesh(self.params))
        self.timing["decode_s"] += time.perf_counter() - t0
        self.launched = True
        return True

    def collect(self) -> list[Finished]:
        """Wait for the dispatched chunk; the requests that finished in it (their slots are free again)."""
        if not self.launched:
            return []
        self.launched = False
        t0 = time.perf_counter()
        if self.placed is not None:   # the device runs the launch's inserts before its chunk: their time is insert_s
            jax.block_until_ready(self.placed)
            self.placed, t_placed = None, time.perf_counter()
            self.timing["insert_s"] += t_placed - t0
            t0 = t_placed
        st = self.state
        t, toks, lens, done, stopped = jax.device_get((st["t"], st["tokens"], st["lengths"], st["done"], st["stopped"]))
        t1 = time.perf_counter()
        self.timing["decode_s"] += t1 - t0
        held = [b for b, o in enumerate(self.owner) if o is not None]
        steps = int(t) - self.t
        self.t, self.index = int(t), self.index + steps
        self.stats["chunks"] += 1
        self.stats["slot_steps"] += self.slots * steps
        self.stats["busy_steps"] += int(sum(int(lens[b]) - int(self.seen[b]) for b in held))
        out, done, push, logps, parking = [], np.array(done), False, None, []
        cut_lo, cut_hi = np.zeros(self.slots, np.int32), np.zeros(self.slots, np.int32)
        for b in held:
            self.seen[b] = lens[b]
            cut = None
            if self.stop_strings and lens[b] > self.checked[b]:
                cut = _first_stop(self.tokenizer, toks[b, :lens[b]].tolist(), int(self.checked[b]), self.stop_strings)
                self.checked[b] = lens[b]
            if not (done[b] or cut is not None):
                continue
            if logps is None:
                logps = np.asarray(st["logprobs"])
            n, reason = finish_row(self.cfg, self.sp, self.true_eos, toks[b], int(lens[b]), bool(stopped[b]), cut)
            req = self.owner[b]
            out.append(Finished(req.rid, toks[b, :n].tolist(), logps[b, :n].tolist(), reason, req.ids))
            self.owner[b], self.seen[b] = None, 0
            released = req.session in self.released
            if released and req.session not in self._in_flight():
                self.released.discard(req.session)
            if req.session is not None and (self.prefix_cache or not released):
                # parked: the row keeps prompt + completion (to the cut) for the next turn; released while in
                # flight, it is a cached row (prefix_cache), else its slot is simply free
                self._park(b, (_CACHED, b) if released else req.session, req.ids, req.ids + out[-1].tokens)
                # the cache slot of the row's first generated token (in a pool of shared prefixes the prompt lies
                # in the group's prefix row, the row's own slots start with its completion)
                first = self.start[b] + (len(req.ids) if self.group == 1 else 0)
                cut_lo[b], cut_hi[b] = first + n, first + lens[b]   # decoded past a stop-string cut: not kept
                parking.append(b)
            push |= not done[b]            # cut by a stop string on the host: the device row must stop too
            done[b] = True
        if push:
            self.state["done"] = jnp.asarray(done)
        if (cut_hi > cut_lo).any():
            self.cache = dict(self.cache, valid=forget(self.cache["valid"], jnp.asarray(cut_lo), jnp.asarray(cut_hi)))
        if self.store is not None and parking:   # the parked rows' completions, before their own slots shift out
            self.store = stash(self.store, self.cache, jnp.asarray(parking + [self.slots] * (bucket(len(parking), 1)
                                                                                          - len(parking)), jnp.int32))
        self.stats["finished"] += len(out)
        self.timing["host_s"] += time.perf_counter() - t1
        return out

    def step(self) -> list[Finished]:
        """launch() + collect()."""
        self.launch()
        return self.collect()
