"""The continuous slot pool's device side (jaxrag.sampling.continuous): jitted operations on its KV cache and per-slot
sampler state. Inserting prefilled prompts into slots (`insert`, `place`; with shared prefixes `insert_shared`,
`place_shared`), extending kept rows by appended ids (`extend_rows`, `extend_branches`), keeping finished branches
(`stash`), dropping tokens past a stop-string cut (`forget`) and rolling the cache (`shift`). The layout and the
scheduling that calls them are described in docs/continuous_batching.md."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxrag.models.config import ModelConfig
from jaxrag.models.transformer import forward_cached_hidden, init_cache, logits_from_hidden
from jaxrag.sampling.generate import _prefill
from jaxrag.sampling.sessions import take_slots

def insert(cfg: ModelConfig, params, cache: dict, state: dict, keys, base_key, tokens, positions, valid, slots, folds,
           n_new: int, rows):
    """Prefill new prompts (tokens/positions/valid [n,P], left-padded: generate.left_pad) with generate's jitted
    prefill (the lock-step sampler's pass: a cache of P + max_new_tokens, so the two share compiled shapes) and
    write them into pool rows `slots` [m] on device (`place`): slot i takes prefill row rows[i], so identical
    prompts are prefilled once. Returns (cache, state, keys)."""
    n, P = tokens.shape
    small = init_cache(cfg, n, P + n_new, cache["k"][0].dtype)
    logits, small = _prefill(cfg, params, tokens, positions, valid, small)
    return place(cache, state, keys, base_key, logits, small, valid, slots, folds, rows)


@functools.partial(jax.jit, donate_argnums=(0, 1, 2))
def place(cache: dict, state: dict, keys, base_key, logits, small: dict, valid, slots, folds, rows):
    """Prefilled prompts (`small`: a cache whose slots [0, P) hold them, `valid` [n,P] their left padding, `logits`
    [n,V] their last columns) written into pool rows `slots` [m]: slot i takes prefilled row rows[i] (the N
    candidates of one prompt share its row: a fork on device, generate.fork's job done in the copy); slots >= the
    pool's rows are padding rows, last, and dropped. Each row gets the keys/values at cache slots [index - P,
    index), valid as its prompt's, nothing else valid; its first logits, positions = prompt lengths, an empty token
    buffer, not done; request keys fold_in(fold_in(base_key, a), b) for folds [m,2]. Needs index >= P (the host
    shifts first). The keys/values are copied one row at a time (dynamic_update_slice in a loop over the real rows,
    in place in the donated cache); a row's other slots keep stale values that are not valid, which attention never
    reads (its mask is a `where`). On XLA:CPU, 40 rows of 256 slots forked from 8 (benchmarks.rollout --kv's model at
    batch 8, N = 5): 4.5 ms, against 25 ms for the fork + scatter of whole zeroed rows this replaced."""
    P, B = valid.shape[1], cache["valid"].shape[0]
    start = cache["index"] - P
    logits, valid = logits[rows], valid[rows]
    m = jnp.sum(slots < B)

    kv = _copy_rows(cache["k"] + cache["v"], small, rows, slots, m, P, start)
    L = len(cache["k"])
    row_valid = jax.lax.dynamic_update_slice(jnp.zeros((len(slots), cache["valid"].shape[1]), bool),
                                             valid.astype(bool), (0, start))
    cache = {"k": kv[:L], "v": kv[L:], "valid": cache["valid"].at[slots].set(row_valid, mode="drop"),
             "index": cache["index"]}
    return (cache, *_fresh_rows(state, keys, base_key, logits, valid, slots, folds))


def _copy_rows(bufs: tuple, small: dict, src, dst, n, P: int, at) -> tuple:
    """`bufs` (k then v buffers [B,K,S,Dh]) with rows dst[i] taking small's rows src[i], slots [0, P), at slot `at`,
    for the first n entries: one row at a time (dynamic_update_slice in a loop, in place in donated buffers)."""
    def copy_row(i, bufs):
        take = lambda new: jax.lax.dynamic_slice(new, (src[i], 0, 0, 0), (1, new.shape[1], P, new.shape[3]))
        return tuple(jax.lax.dynamic_update_slice(buf, take(new), (dst[i], 0, at, 0))
                     for buf, new in zip(bufs, small["k"] + small["v"]))

    return jax.lax.fori_loop(0, n, copy_row, bufs)


def _fresh_rows(state: dict, keys, base_key, logits, valid, slots, folds):
    """(state, keys) with decode rows `slots` [m] (>= B: dropped) started afresh: first logits [m,V], positions =
    their prompts' lengths (valid [m,P]), an empty token buffer, not done, keys fold_in(fold_in(base_key, a), b)
    for folds [m,2]."""
    set_rows = lambda a, x: a.at[slots].set(x, mode="drop")
    state = dict(state, logits=set_rows(state["logits"], logits),
                 tokens=set_rows(state["tokens"], 0), logprobs=set_rows(state["logprobs"], 0.0),
                 lengths=set_rows(state["lengths"], 0),
                 position=set_rows(state["position"], valid.sum(1).astype(jnp.int32)),
                 done=set_rows(state["done"], False), stopped=set_rows(state["stopped"], False))
    fold = jax.vmap(lambda f: jax.random.fold_in(jax.random.fold_in(base_key, f[0]), f[1]))(folds)
    return state, set_rows(keys, fold)


def insert_shared(cfg: ModelConfig, params, cache: dict, state: dict, keys, base_key, tokens, positions, valid,
                  groups, grows, slots, folds, n_new: int, rows):
    """`insert` for a pool whose rows continue shared prefixes (SlotPool(group=m)): the new prompts are prefilled
    as `insert` does, then written once each into prefix rows `groups` (prefill row grows[j] into prefix row
    groups[j]), and their requests' decode rows `slots` start with no slot of their own (`place_shared`)."""
    n, P = tokens.shape
    small = init_cache(cfg, n, P + n_new, cache["k"][0].dtype)
    logits, small = _prefill(cfg, params, tokens, positions, valid, small)
    return place_shared(cache, state, keys, base_key, logits, small, valid, groups, grows, slots, folds, rows)


@functools.partial(jax.jit, donate_argnums=(0, 1, 2))
def place_shared(cache: dict, state: dict, keys, base_key, logits, small: dict, valid, groups, grows, slots, folds,
                 rows):
    """Prefilled prompts (`small` slots [0, P), `valid` [n,P], `logits` [n,V]) written into the pool's prefix rows
    (cache["prefix"]: k/v [U,K,W,Dh], valid [U,W]): prefix row groups[j] takes prefill row grows[j] in its slots
    [0, P), nothing after it valid (groups >= U: padding, dropped). Decode rows `slots` [m] (each in the group of
    the prefix row its prompt went to; slots >= B dropped) get prefill row rows[i]'s logits and position, no valid
    slot of their own (their tokens are all new), a fresh sampler state and key fold_in(fold_in(base_key, a), b).
    As in `place`, the copies run one real prefix row at a time in place in the donated cache."""
    P, pre = valid.shape[1], cache["prefix"]
    U, W = pre["valid"].shape
    kv = _copy_rows(pre["k"] + pre["v"], small, grows, groups, jnp.sum(groups < U), P, 0)
    L = len(pre["k"])
    prefix_valid = pre["valid"].at[groups].set(jnp.pad(valid[grows].astype(bool), ((0, 0), (0, W - P))), mode="drop")
    cache = dict(cache, valid=cache["valid"].at[slots].set(False, mode="drop"),
                 prefix={"k": kv[:L], "v": kv[L:], "valid": prefix_valid})
    return (cache, *_fresh_rows(state, keys, base_key, logits[rows], valid[rows], slots, folds))


@functools.partial(jax.jit, static_argnums=(0, 8, 9))
def extend_rows(cfg: ModelConfig, params, cache: dict, rows, held, tokens, positions, valid, M: int, keep: int):
    """Parked pool rows `rows` [m] continued by appended tokens (tokens/positions/valid [m,A], left-padded,
    positions continuing each row's own): a small cache gets each row's first held[i] valid slots (its last prompt
    + completion, in slot order; tokens a host stop-string cut dropped come after them and are left out)
    right-aligned before slot M, `forward_cached` runs the appended tokens at slots [M, M+A), and every row's
    valid slots are compacted, right-aligned and in order, into the last `keep` slots. Returns (last-column logits
    [m,V], that cache {"k", "v"} [m,K,keep,Dh], its valid [m,keep]): what `place` writes into the rows."""
    pick = lambda bufs: tuple(b[rows] for b in bufs)
    return _extend(cfg, params, pick(cache["k"]), pick(cache["v"]), cache["valid"][rows], held, tokens, positions,
                   valid, M, keep)


@functools.partial(jax.jit, static_argnums=(0, 10, 11))
def extend_branches(cfg: ModelConfig, params, prefix: dict, store: dict, groups, branches, held, tokens, positions,
                    valid, M: int, keep: int):
    """`extend_rows` for a pool of shared prefixes with sessions: parked branch i is its group's prefix row
    groups[i] (the turn's prompt) followed by the branch's completion, stashed in `store` row branches[i]; the
    two are read as one row (prefix slots, then the completion's) and continued as `extend_rows` continues a row."""
    cat = lambda a, b: tuple(jnp.concatenate([x[groups], y[branches]], axis=2) for x, y in zip(a, b))
    return _extend(cfg, params, cat(prefix["k"], store["k"]), cat(prefix["v"], store["v"]),
                   jnp.concatenate([prefix["valid"][groups], store["valid"][branches]], axis=1), held, tokens,
                   positions, valid, M, keep)


def _extend(cfg: ModelConfig, params, k_rows: tuple, v_rows: tuple, valid_rows, held, tokens, positions, valid,
            M: int, keep: int):
    """extend_rows' computation on rows already taken out of their cache (k/v [m,K,S,Dh] per layer, valid [m,S])."""
    A, S = tokens.shape[1], valid_rows.shape[1]
    first = jnp.argsort(~valid_rows, axis=1, stable=True)            # each row's valid slots first, in slot order
    k = jnp.arange(M)[None, :] - (M - held[:, None])                 # the kept token small slot j holds
    src = jnp.take_along_axis(first, jnp.clip(k, 0, S - 1), axis=1)
    pad = lambda a: jnp.pad(a, ((0, 0), (0, 0), (0, A), (0, 0)))
    gather = lambda bufs: tuple(pad(take_slots(b, src)) for b in bufs)
    small = {"k": gather(k_rows), "v": gather(v_rows), "valid": jnp.pad(k >= 0, ((0, 0), (0, A))),
             "index": jnp.asarray(M, jnp.int32)}
    hidden, small = forward_cached_hidden(cfg, params, tokens, positions, valid, small)
    order = jnp.argsort(small["valid"], axis=1, stable=True)[:, M + A - keep:]   # invalid slots first: valid last
    compact = lambda bufs: tuple(take_slots(b, order) for b in bufs)
    return (logits_from_hidden(cfg, params, hidden[:, -1]), {"k": compact(small["k"]), "v": compact(small["v"])},
            jnp.take_along_axis(small["valid"], order, axis=1))


@functools.partial(jax.jit, donate_argnums=(0,))
def stash(store: dict, cache: dict, rows) -> dict:
    """Finished rows' completions kept for their sessions in a pool of shared prefixes: store row rows[i] (the
    slot's own) takes the row's valid cache slots (its generated tokens, to a stop-string cut), compacted to the
    front in slot order, the rest not valid (rows >= B: padding, dropped). A parked row's own slots are then free to
    be shifted out: only its group's prefix row and this copy are read when its session continues."""
    B, N = cache["valid"].shape[0], store["valid"].shape[1]
    take = jnp.minimum(rows, B - 1)
    first = jnp.argsort(~cache["valid"][take], axis=1, stable=True)[:, :N]
    put = lambda dst, src: tuple(d.at[rows].set(take_slots(s[take], first), mode="drop") for d, s in zip(dst, src))
    return {"k": put(store["k"], cache["k"]), "v": put(store["v"], cache["v"]),
            "valid": store["valid"].at[rows].set(jnp.take_along_axis(cache["valid"][take], first, axis=1),
                                                 mode="drop")}


@functools.partial(jax.jit, donate_argnums=(0,))
def forget(valid, lo, hi):
    """valid [B,S] with each row's slots [lo, hi) no longer valid (lo = hi: none)."""
    j = jnp.arange(valid.shape[1])[None, :]
    return valid & ~((j >= lo[:, None]) & (j < hi[:, None]))


@functools.partial(jax.jit, donate_argnums=(0,))
def shift(cache: dict, d) -> dict:
    """Every row's slots moved by d (> 0: toward the end, < 0: toward the start), the slots moved in from the other
    end not valid, index + d. Values do not change (positions are per token; the mask reads slot order)."""
    S = cache["valid"].shape[1]
    j = jnp.arange(S)
    keep = (j >= d) & (j < S + d)
    roll = lambda a: jnp.roll(a, d, axis=2)
    return dict(cache, k=tuple(map(roll, cache["k"])), v=tuple(map(roll, cache["v"])),   # a prefix: as it was
                valid=jnp.roll(cache["valid"], d, axis=1) & keep[None], index=cache["index"] + d)
