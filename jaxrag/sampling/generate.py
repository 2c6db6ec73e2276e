"""Batched generation under jit: prefill once, then decode in jitted chunks with a donated KV cache.

Prompts are left-padded into one [B,P] batch (ragged lengths fine); batch size and prompt length are bucketed
so a rollout loop whose batch shrinks does not recompile every step. Shape floors (`min_rows`, `min_prompt`) pad
small batches and short prompts further: fewer compiled programs where compiling costs more than the padding (a
tiny model: the CI pipeline), the same values up to float rounding. Sampling: greedy (temperature 0),
temperature, top-k, top-p. A row stops at EOS / stop ids (checked on device every step) or at a stop string
(checked on the host between chunks: strings need detokenization). Deterministic for a given PRNG key: decode
row r draws from its own key fold_in(key, r), so a row's sample does not depend on the batch around it.

Shared prefixes: `sample(..., n=N)` prefills each distinct prompt once and `fork`s its cache into N decode rows
on device (a gather of cache rows; no host round trip): N candidates of a state cost one prefill, not N. Where the
rows form equal groups (N samples of distinct prompts), they do not even copy it: the decode cache keeps each
prompt's keys/values once and every step reads them once per group (cascade attention, `cascade_cache`), so the
decode's cache reads and memory shrink about N-fold for long prompts.

Many devices: where the params live on a mesh (or `sample(layout=...)` names one), the prefill and decode rows are
padded to a multiple of data x fsdp and split over it, each device holding and decoding its rows of the KV cache;
the weights keep the layout `place_for_decode` chose (whole on every device, or over the tensor axis), and a call
whose weights + cache exceed a device's budget is refused before compiling (docs/scale.md).

Returned per row: generated ids (including the stop token / the tokens that complete a stop string), the
log-prob of each generated token under the sampling distribution before truncation, log_softmax(logits / T) at the
sampling temperature T (T = 1 values when greedy; top-k / top-p are not applied to the recorded value: what the
RL losses recompute with train.sampling_temperature), the length, and the finish reason.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrag import sharding as shd
from jaxrag.models.config import ModelConfig
from jaxrag.models.transformer import Params, forward_cached, init_cache, param_logical_axes, prefill


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    max_new_tokens: int = 64
    stop_ids: tuple[int, ...] = ()  # besides the model's EOS ids


@dataclasses.dataclass
class Completions:
    tokens: np.ndarray  # [B,N] int32, zeros after `lengths`
    logprobs: np.ndarray  # [B,N] float32, zeros after `lengths`
    lengths: np.ndarray  # [B] int32
    finish_reason: list[str]  # "eos" | "stop" | "length"
    prefill_tokens: int = 0  # token slots the prefill computed (padded rows x padded prompt length)
    timing: dict = dataclasses.field(default_factory=dict)  # prefill_s (host batch prep + prefill), decode_s
    decode_slots: int = 0  # padded rows x decode steps run (a row done early idles in its slot until the last is)

    def row(self, i: int) -> tuple[list[int], list[float]]:
        n = int(self.lengths[i])
        return self.tokens[i, :n].tolist(), self.logprobs[i, :n].tolist()


def bucket(n: int, minimum: int = 8) -> int:
    """Next power of two >= n (at least `minimum`): the set of compiled shapes stays small."""
    return max(minimum, 1 << max(0, (n - 1).bit_length()))


def _filter_logits(logits: jax.Array, temperature: float, top_k: int, top_p: float) -> jax.Array:
    logits = logits / temperature
    if top_k > 0:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly before each sorted token
        cutoff = jnp.min(jnp.where(before < top_p, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return logits


def _pick(logits, keys, sp: SamplingParams):
    """Next token per row; keys [B,2]: each row's own key for this step."""
    if sp.temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return draw(keys, _filter_logits(logits, sp.temperature, sp.top_k, sp.top_p))


def _mix(x):
    """murmur3's 32-bit finalizer: every input bit flips about half the output bits."""
    x = (x ^ (x >> 16)) * jnp.uint32(0x85EBCA6B)
    x = (x ^ (x >> 13)) * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def hashed_uniform(keys, n: int):
    """[B, n] uniforms in (0, 1), 24 bits each, for raw keys [B, 2] (uint32): a counter hash of (key, id), a few
    integer ops an entry where threefry (jax.random.uniform) spends tens. For sampling noise, not cryptography."""
    k = keys.astype(jnp.uint32)
    ids = jnp.arange(n, dtype=jnp.uint32)[None]
    x = _mix(_mix(ids * jnp.uint32(0x9E3779B9) ^ k[:, :1]) + k[:, 1:2])
    return ((x >> 8).astype(jnp.float32) + 0.5) * jnp.float32(2.0 ** -24)


def draw(keys, logits):
    """One categorical draw per row from softmax(logits) (rows [B,V], -inf = excluded), by an exponential race: token i
    with probability p_i and E_i ~ Exp(1) wins argmax p_i / E_i with probability p_i / sum p (gumbel-max with the
    logs moved: log p_i - log E_i is logits + gumbel noise). E_i = -log u_i from `hashed_uniform`, not threefry
    (jax.random.categorical: 2.5 ms of a decode step at 160 rows x 1,024 ids on XLA:CPU, 162 ms at 64 x 128,256;
    this: 0.43 and 14 ms). Like gumbel-max, a draw moves only when the top two of the race nearly tie, so paths whose
    logits differ by float rounding (cascade vs copied prefixes, pool vs lock-step) draw the same tokens from the
    same keys (an inverse-CDF draw moves whenever u falls near any cumulative boundary). An excluded token (p = 0)
    never wins; with 24-bit uniforms E_i lies in [3e-8, 17.3], so a token under about 2e-9 of the top one's
    probability never does either."""
    p = jnp.exp(logits - logits.max(axis=-1, keepdims=True))
    return jnp.argmax(p / -jnp.log(hashed_uniform(keys, logits.shape[-1])), axis=-1).astype(jnp.int32)


def fork(tree, rows):
    """Row r of the result is row rows[r] of `tree`, on device: a KV cache (or per-row sampler state) prefilled
    once per prefix becomes one row per continuation. Leaves are batch-major; scalars (the cache's shared `index`)
    pass through. The copying fork: n samples per prompt (MCTS expansion, rollout values' M continuations of a
    candidate, GRPO groups) take it where their rows do not form equal contiguous groups, else `cascade_cache`,
    which reads the prompt once per group instead of copying it."""
    rows = jnp.asarray(rows, jnp.int32)
    return jax.tree.map(lambda a: a if a.ndim == 0 else jnp.take(a, rows, axis=0), tree)


_prefill = jax.jit(prefill, static_argnums=(0,), donate_argnums=(5,))  # -> (last-column logits [B,V], cache)
_fork = jax.jit(fork)


def cascade_cache(cfg: ModelConfig, prefix: dict, logits, position, m: int, n_new: int, *, mesh: Mesh | None = None):
    """Fork without copying the prefix (cascade attention): the U prefilled prompts of `prefix` (a cache after
    `prefill`, rows [0, U) of logits [U',V] and position [U'] used) each continue in m decode rows, rows
    [u*m, (u+1)*m) prompt u. The decode cache holds every row's own n_new empty slots plus the prompts' keys/values
    once, as its "prefix" (forward_cached attends to both): a decode step reads a prompt once per group instead of
    once per row, and the cache is U*P + U*m*n_new slots instead of U*m*(P + n_new). Returns (logits [U*m,V],
    position [U*m], cache). `prefix` is consumed: where all its rows are used its buffers become the decode cache's
    prefix as they are (donated, not copied). mesh: rows (and the prefix's U rows) split over its data x fsdp where
    they divide, each device holding whole groups and their prompts."""
    U = logits.shape[0]
    shared = {key: prefix[key] for key in ("k", "v", "valid")}
    if prefix["valid"].shape[0] != U:   # fewer prompts than the prefill's padded rows: their first U, a copy
        shared = _first_rows(shared, U)
    return _cascade_cache(cfg, shared, logits, position, m, n_new, mesh)


@functools.partial(jax.jit, static_argnums=1)
def _first_rows(tree, n: int):
    return jax.tree.map(lambda a: a[:n], tree)


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6), donate_argnums=(1,))
def _cascade_cache(cfg: ModelConfig, shared: dict, logits, position, m: int, n_new: int, mesh: Mesh | None):
    rows = lambda a: jnp.repeat(a, m, axis=0)
    own = init_cache(cfg, logits.shape[0] * m, n_new, shared["k"][0].dtype)
    return _constrain_rows((rows(logits), rows(position), dict(own, prefix=shared)), mesh)


def cascade_groups(prefix_of: Sequence[int], n: int) -> int:
    """Rows per prefix (m) when `sample`'s decode rows fall into equal contiguous groups, one per prefilled prompt
    (prompt i's rows i*n .. i*n+n-1 fork prefill row prefix_of[i]; identical prompts in a row share one): else 0."""
    U = max(prefix_of) + 1 if len(prefix_of) else 0
    c = len(prefix_of) // U if U else 0
    if not c or c * U != len(prefix_of) or any(u != i // c for i, u in enumerate(prefix_of)):
        return 0
    return c * n


def params_mesh(params) -> Mesh | None:
    """The mesh the params live on (the RL trainer's arrays, a policy's decode layout), None for plain arrays."""
    return next((x.sharding.mesh for x in jax.tree.leaves(params)
                 if isinstance(getattr(x, "sharding", None), NamedSharding)), None)


def _rows_sharding(mesh: Mesh, a) -> NamedSharding:
    """A decode array's place: batch-major arrays whose rows divide over data x fsdp split their rows there (each
    device holds and decodes its B/n rows), and a KV cache's keys/values [B,K,S,Dh] their K heads over the tensor
    axis too (where the weights split wk/wv's heads, each device writes and reads its own heads: nothing gathered);
    scalars, and arrays whose leading dimension does not divide (a slot pool of an odd size), whole on every
    device."""
    n, tensor = mesh.shape["data"] * mesh.shape["fsdp"], mesh.shape["tensor"]
    if not np.ndim(a) or np.shape(a)[0] % n:
        return NamedSharding(mesh, P())
    if tensor > 1 and np.ndim(a) == 4 and np.shape(a)[1] % tensor == 0:   # keys/values [B,K,S,Dh]: heads as wk's
        return NamedSharding(mesh, P(shd.BATCH_AXES, "tensor", None, None))
    return NamedSharding(mesh, shd.rows_spec(np.ndim(a)))


def _constrain_rows(tree, mesh: Mesh | None):
    """Inside jit: pin every leaf of a decode's batch-major tree to `_rows_sharding` (its rows stay on their
    device through the loop; nothing is gathered)."""
    if mesh is None:
        return tree
    return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, _rows_sharding(mesh, a)), tree)


def on_params_mesh(params, tree, whole=(), mesh: Mesh | None = None):
    """`tree` (batch-major decode arrays: cache, sampler state, row keys) placed as the decode chunk's own outputs
    are, and `whole` (stop ids) replicated, on `mesh` (default: the params' mesh), so that every chunk of a decode
    (the first one fed freshly made arrays, the later ones the previous chunk's outputs) runs one compiled program.
    Rows split over data x fsdp (`_rows_sharding`); a fully replicated array under an equivalent spec (P() and
    P(None, None) hash apart in jit's cache) is re-put, which moves no data. Without a mesh the trees pass as they
    are. Returns (tree, whole)."""
    mesh = mesh if mesh is not None else params_mesh(params)
    if mesh is None:
        return tree, whole

    def put(a, sharding):
        if isinstance(a, jax.Array) and a.committed and a.sharding == sharding:
            return a
        return jax.device_put(a, sharding)

    rep = NamedSharding(mesh, P())
    return (jax.tree.map(lambda a: put(a, _rows_sharding(mesh, a)), tree),
            jax.tree.map(lambda a: put(a, rep), whole))


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _zeros_cache(cfg: ModelConfig, batch: int, slots: int, mesh: Mesh | None):
    """An empty KV cache made where its rows belong (on a mesh: each device allocates only its rows)."""
    return _constrain_rows(init_cache(cfg, batch, slots), mesh)


def _put_rows(mesh: Mesh | None, tree):
    """Host batch arrays -> device arrays, rows split over the mesh's data x fsdp (no mesh: default device)."""
    if mesh is None:
        return jax.tree.map(jnp.asarray, tree)
    return jax.tree.map(lambda a: jax.device_put(a, _rows_sharding(mesh, a)), tree)


def cache_bytes(cfg: ModelConfig, rows: int, slots: int, dtype=None) -> int:
    """Bytes of a KV cache of `rows` x `slots` (keys, values and the valid mask)."""
    dt = jnp.dtype(dtype or cfg.cache_dtype or cfg.dtype)
    return rows * slots * (2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * dt.itemsize + 1)


def weights_bytes(params) -> int:
    """Bytes of one device's shard of every weight (the params as placed)."""
    total = 0
    for a in jax.tree.leaves(params):
        shape = a.sharding.shard_shape(a.shape) if isinstance(a, jax.Array) else np.shape(a)
        total += int(np.prod(shape)) * np.dtype(a.dtype).itemsize
    return total


def decode_layout(params, mesh: Mesh | None = None, budget_bytes: int | None = None) -> shd.DecodeLayout | None:
    """The layout a decode of `params` runs under: `mesh` (default: the params' own) with the weights as placed;
    None without a mesh (one device: nothing to split)."""
    mesh = mesh if mesh is not None else params_mesh(params)
    return None if mesh is None else shd.DecodeLayout(mesh, "as placed", budget_bytes)


def place_for_decode(cfg: ModelConfig, params, mesh: Mesh | None = None, budget_bytes: int | None = None):
    """Params (stacked layers, any placement) -> (params in their decode layout, the layout), chosen once per
    policy load / RL step: whole on every device where they fit (shd.choose_decode_layout), else split over the
    tensor axis; a mesh whose devices cannot hold them is refused here, before anything compiles. No mesh given
    and none on the params: (params, None)."""
    mesh = mesh if mesh is not None else params_mesh(params)
    if mesh is None:
        return params, None
    axes = param_logical_axes(cfg)
    layout = shd.choose_decode_layout(mesh, params, axes, budget_bytes=budget_bytes)
    return jax.device_put(params, layout.weight_shardings(params, axes)), layout


@functools.partial(jax.jit, static_argnums=1)
def row_keys(key: jax.Array, n_rows: int) -> jax.Array:
    """Per-row sampling keys [n_rows, 2]: row r gets fold_in(key, r)."""
    return jax.vmap(lambda r: jax.random.fold_in(key, r))(jnp.arange(n_rows))


@functools.partial(jax.jit, static_argnums=(0, 1, 2), static_argnames=("mesh",), donate_argnums=(4, 5))
def _decode_chunk(cfg: ModelConfig, sp: SamplingParams, chunk: int, params, cache, state, stop_ids, keys, *,
                  mesh: Mesh | None = None):
    """Up to `chunk` decode steps for every row not done; stops early once all rows are done. keys [B,2].
    mesh: the batch-major arrays' rows stay split over its data x fsdp through the loop (`_constrain_rows`).

    Each row runs its own step count: row b writes its next token at column lengths[b] and draws with
    fold_in(keys[b], lengths[b]), and is done at a stop id or once it holds max_new_tokens (the token buffer's
    width). In one `sample` batch every live row is at step t (the same values as a shared step counter); the slot
    pool (jaxrag.sampling.continuous) runs rows inserted at different times through this same loop, and with
    state["exit_done"] (an int32 scalar) the loop also ends once that many rows are done; in a cache with a
    "prefix" (rows in groups of m continuing one prefix row each), once that many whole groups are done, as a
    group's slots take new work only together. The loop also ends when the cache's write index reaches its last
    slot (a step there would have its start clamped by dynamic_update_slice and overwrite the last slot): callers
    size the cache for every step they ask for, so this only turns a sizing mistake into a short chunk, which
    `decode` reports."""
    n_max = state["tokens"].shape[1]
    t_end = state["t"] + chunk
    rows = jnp.arange(state["tokens"].shape[0])
    m = rows.shape[0] // cache["prefix"]["valid"].shape[0] if "prefix" in cache else 1
    slots = cache["valid"].shape[1]

    def cond(s):
        go = (s["t"] < t_end) & ~jnp.all(s["done"]) & (s["cache"]["index"] < slots)
        if "exit_done" in s:   # the slot pool: hand back once this many rows (groups) are done: they take new work
            go &= jnp.sum(jnp.all(s["done"].reshape(-1, m), axis=1)) < s["exit_done"]
        return go

    def body(s):
        cache, st = s["cache"], dict(s)
        logits, step = st["logits"], st["lengths"]
        tok = _pick(logits, jax.vmap(jax.random.fold_in)(keys, step), sp)
        t_logp = sp.temperature if sp.temperature > 0 else 1.0  # behaviour log-prob at the sampling temperature
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits / t_logp, axis=-1), tok[:, None], axis=-1)[:, 0]
        live = ~st["done"]
        tok = jnp.where(live, tok, 0)
        logp = jnp.where(live, logp, 0.0)
        if mesh is None:
            st["tokens"] = st["tokens"].at[rows, step].set(tok, mode="drop")
            st["logprobs"] = st["logprobs"].at[rows, step].set(logp, mode="drop")
        else:   # the same write as a select: a row-split scatter would gather its indices and values every step
            at = jnp.arange(n_max)[None] == step[:, None]
            st["tokens"] = jnp.where(at, tok[:, None], st["tokens"])
            st["logprobs"] = jnp.where(at, logp[:, None], st["logprobs"])
        st["lengths"] = step + live.astype(jnp.int32)
        hit_eos = live & jnp.any(tok[:, None] == stop_ids[None, :], axis=-1)
        st["stopped"] = st["stopped"] | hit_eos
        st["done"] = st["done"] | hit_eos | (st["lengths"] >= n_max)
        logits, cache = forward_cached(cfg, params, tok[:, None], st["position"][:, None], live[:, None], cache)
        st["logits"] = logits[:, 0]
        st["position"] = st["position"] + 1
        st["t"] = st["t"] + 1
        st["cache"] = cache
        return _constrain_rows(st, mesh)

    out = jax.lax.while_loop(cond, body, _constrain_rows(dict(state, cache=cache), mesh))
    cache = out.pop("cache")
    return cache, out


def left_pad(prompts: Sequence[Sequence[int]], batch: int, length: int):
    """Prompts right-aligned in [batch, length] (token 0 in the padding): tokens, positions (each prompt's own,
    from 0), valid. The layout `prefill` takes (the sampler's, and the critic's shared-prompt pass)."""
    tokens = np.zeros((batch, length), np.int32)
    valid = np.zeros((batch, length), bool)
    for i, p in enumerate(prompts):
        if len(p):
            tokens[i, length - len(p):] = p
            valid[i, length - len(p):] = True
    positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0).astype(np.int32)
    return tokens, positions, valid


def _first_stop(tokenizer, ids: list[int], start: int, stop_strings: Sequence[str]) -> int | None:
    """Smallest n > start such that decode(ids[:n]) contains a stop string, else None."""
    text = tokenizer.decode(ids)
    if not any(s in text for s in stop_strings):
        return None
    for n in range(start + 1, len(ids) + 1):
        if any(s in tokenizer.decode(ids[:n]) for s in stop_strings):
            return n
    return len(ids)


def sample(
    cfg: ModelConfig,
    params: Params,
    prompts: Sequence[Sequence[int]],
    sp: SamplingParams,
    key: jax.Array,
    stop_strings: Sequence[str] | None = None,
    tokenizer=None,
    chunk: int | None = None,
    *,
    n: int = 1,
    share_prefix: bool = True,
    cascade: bool = True,
    min_rows: int = 1,
    min_prompt: int = 16,
    layout: shd.DecodeLayout | None = None,
) -> Completions:
    """Generate n samples of each token-id prompt: rows i*n .. i*n+n-1 of the result are prompt i's.

    share_prefix: prefill each distinct prompt once and fork its cache into its decode rows (identical prompts in
    the batch share too); False = prefill every row (the replicate-and-prefill path; same tokens and log-probs).
    cascade: where the shared rows form equal contiguous groups (n samples of distinct prompts; a prompt repeated
    the same number of times in a row), the decode rows do not copy their prompt's cache but read it once per group
    (`cascade_cache`); False = fork by copying. Same tokens and log-probs to float rounding.
    min_rows / min_prompt: the fewest rows (decode and prefill) and prompt columns a batch is padded to (powers of
    two above them, the prompt capped at max_seq_len - max_new_tokens). Decode row r samples with fold_in(key, r)
    either way. layout (default: the params' mesh, weights as placed; `place_for_decode` chooses one): the
    prefill and decode rows are padded to a multiple of data x fsdp and split over it, each device holding and
    decoding its share of the KV cache (the same tokens as one device; log-probs to float rounding); weights + KV
    cache per device over the layout's budget are refused before compiling. See the module docstring for what
    comes back."""
    if n < 1:
        raise ValueError(f"sample: n={n}; need n >= 1")
    if not prompts:
        return Completions(np.zeros((0, sp.max_new_tokens), np.int32), np.zeros((0, sp.max_new_tokens), np.float32), np.zeros(0, np.int32), [])
    if any(len(p) == 0 for p in prompts):
        raise ValueError("sample: every prompt needs at least one token (add a BOS token)")
    if stop_strings and tokenizer is None:
        raise ValueError("sample: stop_strings need a tokenizer to detokenize")
    B, N = len(prompts) * n, sp.max_new_tokens  # B: decode rows
    if min_rows < 1 or min_prompt < 1:
        raise ValueError(f"sample: min_rows={min_rows}, min_prompt={min_prompt}; both must be >= 1")
    layout = layout if layout is not None else decode_layout(params)
    mesh = layout.mesh if layout is not None else None
    pad = layout.pad if layout is not None else (lambda rows: rows)   # rows: a multiple of the devices they split over
    B_pad = pad(bucket(B, min_rows))
    P = bucket(max(len(p) for p in prompts), min_prompt)
    if P + N > cfg.max_seq_len:
        P_max = cfg.max_seq_len - N
        if max(len(p) for p in prompts) > P_max:
            raise ValueError(f"sample: prompt of {max(len(p) for p in prompts)} tokens + {N} new exceeds max_seq_len={cfg.max_seq_len}")
        P = P_max
    m = 0  # decode rows per prefill row when the cascade path reads each prompt once per group
    if share_prefix:  # prefill rows: the distinct prompts; decode row r forks prefill row rows[r]
        first: dict[tuple[int, ...], int] = {}
        prefix = [first.setdefault(tuple(p), len(first)) for p in prompts]
        prefill_prompts = [list(p) for p in first]
        rows = np.array([prefix[r // n] for r in range(B)] + [0] * (B_pad - B), np.int32)
        if len(prefill_prompts) == B:  # nothing shared: prefill rows are the decode rows
            rows = None
        elif cascade:
            m = cascade_groups(prefix, n)
    else:
        prefill_prompts = [p for p in prompts for _ in range(n)]
        rows = None
    t_prefill = time.perf_counter()
    U, U_pad = len(prefill_prompts), pad(bucket(len(prefill_prompts), min_rows))
    U_dec = pad(bucket(U, -(-min_rows // m))) if m else 0   # cascade: decode rows U_dec * m >= min_rows
    if layout is not None:
        n_dev = layout.n_rows
        need = cache_bytes(cfg, U_pad // n_dev, P if m else P + N)   # the prefill's cache
        need += cache_bytes(cfg, U_dec * m // n_dev, N) if m else cache_bytes(cfg, B_pad // n_dev, P + N) * (rows is not None)
        shd.check_decode_memory(layout, weights_bytes(params), need,
                                f"sample of {B} rows ({B_pad // n_dev} per device) x {P} + {N} tokens")
    tokens, positions, valid = left_pad(prefill_prompts, U_pad, P)
    cache = _zeros_cache(cfg, U_pad, P if m else P + N, mesh)
    logits, cache = _prefill(cfg, params, *_put_rows(mesh, (tokens, positions, valid)), cache)
    position = _put_rows(mesh, valid.sum(1).astype(np.int32))
    if m:   # the prompts' cache shared by their groups
        logits, position, cache = cascade_cache(cfg, cache, logits[:U_dec], position[:U_dec], m, N, mesh=mesh)
    elif rows is not None:
        logits, cache, position = _fork((logits, cache, position), _put_rows(mesh, rows))
    jax.block_until_ready(logits)  # the prefill / decode time split (a sync the decode loop would wait on anyway)
    t_decode = time.perf_counter()
    completions, _ = decode(cfg, params, cache, logits, position, B, sp, key, stop_strings, tokenizer, chunk, mesh=mesh)
    completions.prefill_tokens = U_pad * P
    completions.timing["prefill_s"] = t_decode - t_prefill
    completions.timing["decode_s"] = time.perf_counter() - t_decode
    return completions


def finish_row(cfg: ModelConfig, sp: SamplingParams, true_eos, toks, length: int, stopped: bool, cut: int | None):
    """A finished row's kept length and finish reason: a host stop-string cut (`cut`: tokens up to and including
    the stop string) shortens it ("stop", or "eos" when the cut ends at an EOS id the device also stopped at); a
    device stop id is "stop" for the sampler's extra stop ids, "eos" for the model's; else "length"."""
    if cut is not None:
        length = min(length, cut)
        return length, ("eos" if stopped and length == cut and toks[length - 1] in true_eos else "stop")
    if stopped:
        last = toks[length - 1]
        return length, ("stop" if last in sp.stop_ids and last not in cfg.eos_ids else "eos")
    return length, "length"


def stop_ids_of(cfg: ModelConfig, sp: SamplingParams, tokenizer=None) -> tuple[tuple[int, ...], jax.Array]:
    """(the model's + tokenizer's EOS ids, the device stop-id array: those and sp.stop_ids; [-1] when none)."""
    true_eos = tuple(cfg.eos_ids) + tuple(getattr(tokenizer, "eos_ids", ()) or ())
    eos = true_eos + tuple(sp.stop_ids)
    return true_eos, jnp.asarray(eos if eos else (-1,), jnp.int32)


def decode(cfg: ModelConfig, params: Params, cache, logits, position, n_rows: int, sp: SamplingParams, key: jax.Array,
           stop_strings: Sequence[str] | None = None, tokenizer=None, chunk: int | None = None, *,
           mesh: Mesh | None = None):
    """The decode loop after a prefill: rows [0, n_rows) of the padded batch (`logits` [B_pad,V], `position` [B_pad],
    `cache` holding their prompts) sample up to sp.max_new_tokens each; decode row r draws with fold_in(key, r).
    Returns (Completions, the cache after decode: every generated token's keys/values written at slots
    [index0, index0 + t), including tokens a host stop-string check later cut off). mesh (default: the params'):
    the rows are split over its data x fsdp where B_pad divides (`on_params_mesh`)."""
    B, B_pad, N = n_rows, logits.shape[0], sp.max_new_tokens
    mesh = mesh if mesh is not None else params_mesh(params)
    true_eos, stop_ids = stop_ids_of(cfg, sp, tokenizer)
    key = row_keys(key, B_pad)
    state = {
        "logits": logits,
        "tokens": jnp.zeros((B_pad, N), jnp.int32),
        "logprobs": jnp.zeros((B_pad, N), jnp.float32),
        "lengths": jnp.zeros((B_pad,), jnp.int32),
        "position": position,
        "done": jnp.asarray(np.arange(B_pad) >= B),  # padding rows start done
        "stopped": jnp.zeros((B_pad,), bool),
        "t": jnp.zeros((), jnp.int32),
    }
    chunk = chunk or (16 if stop_strings else N)
    string_stopped = np.zeros(B_pad, bool)
    cut = np.full(B_pad, -1)
    checked = np.zeros(B_pad, np.int64)
    t = 0
    while True:
        (cache, state, key), stop_ids = on_params_mesh(params, (cache, state, key), stop_ids, mesh)
        t_before = t
        cache, state = _decode_chunk(cfg, sp, chunk, params, cache, state, stop_ids, key, mesh=mesh)
        t = int(state["t"])
        if t < min(t_before + chunk, N) and not bool(np.all(np.asarray(state["done"]))):
            raise ValueError(f"decode: the KV cache's {cache['valid'].shape[1]} slots are full after {t} of "
                             f"{N} new tokens; size the cache for the prompt + max_new_tokens")
        if stop_strings:
            toks, lens, done = np.asarray(state["tokens"]), np.asarray(state["lengths"]), np.array(state["done"])
            for i in range(B):
                if string_stopped[i] or lens[i] == checked[i]:
                    continue
                n = _first_stop(tokenizer, toks[i, : lens[i]].tolist(), int(checked[i]), stop_strings)
                checked[i] = lens[i]
                if n is not None:
                    string_stopped[i], cut[i], done[i] = True, n, True
            state["done"] = jnp.asarray(done)
        if t >= N or bool(np.all(np.asarray(state["done"]))):
            break
    toks = np.array(state["tokens"])[:B]
    logps = np.array(state["logprobs"])[:B]
    lens = np.asarray(state["lengths"])[:B].copy()
    stopped = np.asarray(state["stopped"])[:B]
    reasons = []
    for i in range(B):
        lens[i], reason = finish_row(cfg, sp, true_eos, toks[i], int(lens[i]), bool(stopped[i]),
                                     int(cut[i]) if string_stopped[i] else None)
        reasons.append(reason)
        toks[i, lens[i]:] = 0
        logps[i, lens[i]:] = 0.0
    return Completions(toks, logps, lens.astype(np.int32), reasons, decode_slots=B_pad * t), cache
