"""The Llama-3.x / Qwen2 decoder as pure functions over a params pytree.

Layer weights are stacked over layers (leading axis L) and run with `lax.scan`, so compile time does not grow
with depth. Shapes: B batch, T query length, S key length (cache slots), D d_model, H query heads, K kv heads,
G = H // K, Dh head_dim, F d_ff, V vocab.

Masks: `segment_ids[B,T]`, 0 = padding; a token attends causally to earlier tokens of the same segment (so
packed sequences and left/right padding both work). `positions[B,T]` feed RoPE and are independent of the
index in the row, which is what left-padded batches and packed sequences need.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrag.models import tpu_attention
from jaxrag.models.config import ModelConfig

Params = dict[str, Any]
NEG_INF = -1e30


# --------------------------------------------------------------------------------------------- parameters
def param_shapes(cfg: ModelConfig) -> Params:
    L, D, H, K, Dh, F, V = cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff, cfg.vocab_size
    layers = {
        "attn_norm": (L, D),
        "wq": (L, D, H, Dh),
        "wk": (L, D, K, Dh),
        "wv": (L, D, K, Dh),
        "wo": (L, H, Dh, D),
        "mlp_norm": (L, D),
        "w_gate": (L, D, F),
        "w_up": (L, D, F),
        "w_down": (L, F, D),
    }
    if cfg.qkv_bias:
        layers.update(bq=(L, H, Dh), bk=(L, K, Dh), bv=(L, K, Dh))
    if cfg.o_bias:
        layers.update(bo=(L, D))
    shapes = {"embed": (V, D), "layers": layers, "final_norm": (D,)}
    if not cfg.tie_embeddings:
        shapes["lm_head"] = (D, V)
    return shapes


_LOGICAL = {
    "embed": ("vocab", "embed"),
    "attn_norm": ("layers", "embed"),
    "mlp_norm": ("layers", "embed"),
    "wq": ("layers", "embed", "heads", "head_dim"),
    "wk": ("layers", "embed", "kv_heads", "head_dim"),
    "wv": ("layers", "embed", "kv_heads", "head_dim"),
    "wo": ("layers", "heads", "head_dim", "embed"),
    "bq": ("layers", "heads", "head_dim"),
    "bk": ("layers", "kv_heads", "head_dim"),
    "bv": ("layers", "kv_heads", "head_dim"),
    "bo": ("layers", "embed"),
    "w_gate": ("layers", "embed", "mlp"),
    "w_up": ("layers", "embed", "mlp"),
    "w_down": ("layers", "mlp", "embed"),
    "final_norm": ("embed",),
    "lm_head": ("embed", "vocab"),
}


def param_logical_axes(cfg: ModelConfig) -> Params:
    """Same tree as the params; each leaf a tuple of logical axis names (see jaxrag.sharding.DEFAULT_RULES)."""
    shapes = param_shapes(cfg)
    return {
        k: ({n: _LOGICAL[n] for n in v} if isinstance(v, dict) else _LOGICAL[k]) for k, v in shapes.items()
    }


def init_params(cfg: ModelConfig, key: jax.Array, std: float = 0.02) -> Params:
    """Random init: normal(std) for matrices, ones for norms, zeros for biases.

    Args:
      cfg: the model config (shapes, cfg.param_dtype).
      key: a PRNG key.
      std: the standard deviation of the matrices.

    Returns:
      The params pytree (param_shapes' tree, layer weights stacked over L) in cfg.param_dtype.
    """
    dtype = jnp.dtype(cfg.param_dtype)

    def make(name, shape, k):
        if "norm" in name:
            return jnp.ones(shape, dtype)
        if name in ("bq", "bk", "bv", "bo"):
            return jnp.zeros(shape, dtype)
        return (std * jax.random.normal(k, shape, jnp.float32)).astype(dtype)

    shapes = param_shapes(cfg)
    k_top, k_layers = jax.random.split(key)
    layer_keys = jax.random.split(k_layers, len(shapes["layers"]))
    top_keys = jax.random.split(k_top, len(shapes))
    params = {n: make(n, s, k) for (n, s), k in zip(shapes.items(), top_keys) if n != "layers"}
    params["layers"] = {n: make(n, s, k) for (n, s), k in zip(shapes["layers"].items(), layer_keys)}
    return params


# ------------------------------------------------------------------------------------------------ pieces
def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (w.astype(jnp.float32) * y).astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Inverse frequencies [Dh/2], with Llama-3.1 'llama3' or 'linear' scaling when configured."""
    dh = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, dh, 2, dtype=np.float64) / dh))
    s = cfg.rope_scaling_dict
    if s is None:
        return inv.astype(np.float32)
    if s["rope_type"] == "linear":
        return (inv / s["factor"]).astype(np.float32)
    # llama3: low frequencies divided by `factor`, high ones kept, a smooth ramp in between.
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old_len / lo, inv / factor, inv)
    smooth = (old_len / wavelen - lo) / (hi - lo)
    ramp = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / hi) & (wavelen <= old_len / lo)
    return np.where(medium, ramp, scaled).astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """x [B,T,N,Dh], positions [B,T]; the rotate-half convention of the Hugging Face checkpoints."""
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B,T,Dh/2]
    cos = jnp.concatenate([jnp.cos(angles)] * 2, axis=-1)[:, :, None, :]
    sin = jnp.concatenate([jnp.sin(angles)] * 2, axis=-1)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


def stack_query_heads(q: jax.Array, K: int, dtype) -> jax.Array:
    """q [B,T,H,Dh] -> [B,K,G*T,Dh] in `dtype`: the G = H/K query heads that share a kv head stacked along the query
    axis (G outer, T inner), so attention's products are batched GEMMs over (B, K) with M = G*T."""
    B, T, H, Dh = q.shape
    G = H // K
    return q.astype(dtype).reshape(B, T, K, G, Dh).transpose(0, 2, 3, 1, 4).reshape(B, K, G * T, Dh)


def unstack_query_heads(out: jax.Array, T: int) -> jax.Array:
    """`stack_query_heads`' inverse: [B,K,G*T,Dh] (or [B,K,G,T,Dh]) -> [B,T,H,Dh]."""
    B, K, Dh = out.shape[0], out.shape[1], out.shape[-1]
    G = out.size // (B * K * T * Dh)
    return out.reshape(B, K, G, T, Dh).transpose(0, 3, 1, 2, 4).reshape(B, T, K * G, Dh)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, precision: str | None = None) -> jax.Array:
    """Grouped-query attention over head-major keys/values (the KV cache's layout).

    q [B,T,H,Dh], k/v [B,K,S,Dh], mask [B,T,S] (True = may attend) -> [B,T,H,Dh] in q's dtype. The G = H/K query
    heads that share a kv head are stacked along the query axis (`stack_query_heads`), so both products are batched
    GEMMs over (B, K) with M = G*T (about 1.3x faster forward+backward on XLA:CPU than a 5-D einsum). A cache
    stored in a narrower dtype than the compute (bf16 cache, fp32 compute) is read as it is: q is cast to it,
    products accumulate fp32."""
    B, T, H, Dh = q.shape
    K, S = k.shape[1], k.shape[2]
    G = H // K
    out_dtype = q.dtype
    q = stack_query_heads(q, K, k.dtype)
    scores = jnp.matmul(q, k.swapaxes(-1, -2), precision=precision, preferred_element_type=jnp.float32) / math.sqrt(Dh)
    scores = jnp.where(mask[:, None, None], scores.reshape(B, K, G, T, S), NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype).reshape(B, K, G * T, S)
    return unstack_query_heads(jnp.matmul(probs, v, precision=precision).astype(out_dtype), T)


def attend_shared(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, pk: jax.Array, pv: jax.Array,
                  prefix_valid: jax.Array, precision: str | None = None) -> jax.Array:
    """`attend` for rows that continue a shared prefix (cascade attention): decode rows [u*m, (u+1)*m) all follow
    prefix row u, whose keys/values pk/pv [U,K,P,Dh] (valid [U,P]) sit once in memory instead of once per row.

    q [B,T,H,Dh] with B = U*m, k/v [B,K,S,Dh] and mask [B,T,S]: each row's own slots (what it generated). The
    prefix part is one batched GEMM per prefix row with the m rows' queries stacked (M = m*G*T): the prefix is read
    once per group, not once per row. The two parts' softmaxes are merged by their running max and sum (as
    flash-decoding merges blocks), so the result is `attend` over the row's prefix followed by its own slots, to
    float rounding. A row with nothing valid in either part gets zeros."""
    B, T, H, Dh = q.shape
    K, U = k.shape[1], pk.shape[0]
    G, m = H // K, B // U
    out_dtype = q.dtype
    scale = 1.0 / math.sqrt(Dh)

    def part(qh, kk, vv, ok):   # -> running max, sum [X,K,M], unnormalized output [X,K,M,Dh]
        s = jnp.matmul(qh, kk.swapaxes(-1, -2), precision=precision, preferred_element_type=jnp.float32) * scale
        s = jnp.where(ok, s, NEG_INF)
        top = s.max(-1)
        p = jnp.where(ok, jnp.exp(s - top[..., None]), 0.0)
        out = jnp.matmul(p.astype(vv.dtype), vv, precision=precision, preferred_element_type=jnp.float32)
        return top, p.sum(-1), out

    qh = stack_query_heads(q, K, k.dtype)
    own = part(qh, k, v, jnp.broadcast_to(mask[:, None, None], (B, 1, G, T, k.shape[2])).reshape(B, 1, G * T, -1))
    qp = qh.astype(pk.dtype).reshape(U, m, K, G * T, Dh).swapaxes(1, 2).reshape(U, K, m * G * T, Dh)
    shared = part(qp, pk, pv, prefix_valid[:, None, None, :])
    per_row = lambda x: x.reshape(U, K, m, G * T, *x.shape[3:]).swapaxes(1, 2).reshape(B, K, G * T, *x.shape[3:])
    (m1, s1, a1), (m2, s2, a2) = own, tuple(per_row(x) for x in shared)
    top = jnp.maximum(m1, m2)
    r1, r2 = jnp.exp(m1 - top), jnp.exp(m2 - top)
    out = (a1 * r1[..., None] + a2 * r2[..., None]) / jnp.maximum(s1 * r1 + s2 * r2, 1e-30)[..., None]
    return unstack_query_heads(out.astype(out_dtype), T)


def window_blocks(lo, end, block: int):
    """(first slot, number of blocks) of the window [lo, end) read `block` slots at a time from lo rounded down to
    a multiple of `block`."""
    first = (lo // block) * block
    return first, (end - first + block - 1) // block


def attend_window(q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array, query_slots: jax.Array, lo: jax.Array,
                  block: int, precision: str | None = None) -> jax.Array:
    """`attend` over a KV cache's filled window only: slots [lo, query_slots[-1] + 1), `block` at a time.

    q [B,T,H,Dh] (T new tokens at cache slots query_slots [T]), k/v [B,K,S,Dh], valid [B,S]; a token attends to
    valid slots <= its own, as `forward_cached`'s mask says. The blocks start at lo rounded down to a multiple of
    `block` and run under a loop with a traced trip count, each a pair of batched GEMMs over `block` slots with
    flash-decoding's running max and sum: a step reads the slots the rows hold, not the whole cache. The last block
    is clamped into the cache and skips slots an earlier block took. A row with no slot to attend to gets zeros."""
    B, T, H, Dh = q.shape
    K, S = k.shape[1], k.shape[2]
    G, C = H // K, min(block, S)
    out_dtype = q.dtype
    q = stack_query_heads(q, K, k.dtype)
    first, n_blocks = window_blocks(lo, query_slots[-1] + 1, C)

    def body(j, carry):
        run_max, run_sum, acc = carry
        nominal = first + j * C
        at = jnp.minimum(nominal, S - C)
        slots = at + jnp.arange(C)
        ok = (slots[None, :] <= query_slots[:, None]) & (slots >= nominal)[None, :]  # [T,C]
        mask = (ok[None] & jax.lax.dynamic_slice_in_dim(valid, at, C, axis=1)[:, None, :])[:, None, None]  # [B,1,1,T,C]
        kb = jax.lax.dynamic_slice_in_dim(k, at, C, axis=2)
        vb = jax.lax.dynamic_slice_in_dim(v, at, C, axis=2)
        s = jnp.matmul(q, kb.swapaxes(-1, -2), precision=precision, preferred_element_type=jnp.float32) / math.sqrt(Dh)
        s = jnp.where(mask, s.reshape(B, K, G, T, C), NEG_INF)
        new_max = jnp.maximum(run_max, s.max(-1))
        p = jnp.where(mask, jnp.exp(s - new_max[..., None]), 0.0)
        rescale = jnp.exp(run_max - new_max)
        pv = jnp.matmul(p.astype(v.dtype).reshape(B, K, G * T, C), vb, precision=precision,
                        preferred_element_type=jnp.float32).reshape(B, K, G, T, Dh)
        return new_max, run_sum * rescale + p.sum(-1), acc * rescale[..., None] + pv

    init = (jnp.full((B, K, G, T), NEG_INF, jnp.float32), jnp.zeros((B, K, G, T), jnp.float32),
            jnp.zeros((B, K, G, T, Dh), jnp.float32))
    _, run_sum, acc = jax.lax.fori_loop(0, n_blocks, body, init)
    return unstack_query_heads((acc / jnp.maximum(run_sum, 1e-30)[..., None]).astype(out_dtype), T)


def cache_block(cfg: ModelConfig, slots: int) -> int:
    """The block size cache attention may read a `slots`-slot cache's filled window at: cfg.cache_block, None
    decided by backend (64 on CPU, tpu_attention.DECODE_CACHE_BLOCK on TPU, 0 on GPU); 0 (always one pass over every slot) for a cache of fewer than 8
    blocks, where a window skips too little to pay for compiling its loop."""
    default = {"cpu": 64, "tpu": tpu_attention.DECODE_CACHE_BLOCK}.get(jax.default_backend(), 0)
    block = cfg.cache_block if cfg.cache_block is not None else default
    return block if 0 < block and 8 * block <= slots else 0


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, precision: str | None = None) -> jax.Array:
    """Grouped-query attention. q [B,T,H,Dh], k/v [B,S,K,Dh], mask [B,T,S] (True = may attend) -> [B,T,H,Dh]."""
    return attend(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask, precision)


def dense(x: jax.Array, w: jax.Array, n_in: int = 1, precision: str | None = None) -> jax.Array:
    """Contract the last `n_in` axes of x with the first `n_in` of w as one 2-D matmul over flattened leading axes.

    Same values as the einsum; XLA:CPU runs the flattened GEMMs (and their transposes in the backward pass) far
    faster than 3-D/4-D dot_generals: 1.6x on a SwiGLU MLP's forward+backward at d_model 512 (benchmarks.model)."""
    lead, inner, out = x.shape[: x.ndim - n_in], w.shape[:n_in], w.shape[n_in:]
    y = jnp.matmul(x.reshape(-1, math.prod(inner)), w.reshape(math.prod(inner), -1), precision=precision)
    return y.reshape(*lead, *out)


def _project_qkv(cfg, lp, h, positions, inv_freq):
    pr = cfg.matmul_precision
    q, k, v = dense(h, lp["wq"], 1, pr), dense(h, lp["wk"], 1, pr), dense(h, lp["wv"], 1, pr)  # [B,T,H|K,Dh]
    if cfg.qkv_bias:
        q, k, v = q + lp["bq"], k + lp["bk"], v + lp["bv"]
    return apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq), v


def _attn_out_and_mlp(cfg, lp, x, attn):
    pr = cfg.matmul_precision
    out = dense(attn, lp["wo"], 2, pr)
    if cfg.o_bias:
        out = out + lp["bo"]
    x = x + out
    h = rms_norm(x, lp["mlp_norm"], cfg.rms_eps)
    return x + dense(jax.nn.silu(dense(h, lp["w_gate"], 1, pr)) * dense(h, lp["w_up"], 1, pr), lp["w_down"], 1, pr)


def _cast_layer(cfg, lp):
    dt = jnp.dtype(cfg.dtype)
    return {n: (w if "norm" in n else w.astype(dt)) for n, w in lp.items()}


def _embed(cfg, params, tokens):
    return jnp.take(params["embed"], tokens, axis=0).astype(jnp.dtype(cfg.dtype))


def row_devices() -> int:
    """Devices the rows of an activation are split over under the mesh in context (data x fsdp; 1 without one)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return 1
    return math.prod(mesh.shape[a] for a in tpu_attention.BATCH_AXES if a in mesh.axis_names)


def constrain_rows(x: jax.Array, rest=None, dim: int = 0) -> jax.Array:
    """Pin an activation x [B, ...] to rows split over the batch axes (data x fsdp) of the mesh in context
    (`jax.set_mesh` / `jax.sharding.use_abstract_mesh`: the train step sets it), its other dimensions `rest`
    (None: whole on every device; P.UNCONSTRAINED: XLA's choice). Without it, XLA's partitioner splits the matmuls
    of a training step over the fsdp-sharded weights' embed dimension and keeps every token on every device
    (activations all-reduced and gathered, not the weights). `dim`: the rows' dimension. No mesh, one device, or
    the rows not divisible: x as is."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return x
    axes = tuple(a for a in tpu_attention.BATCH_AXES if a in mesh.axis_names and mesh.shape[a] > 1)
    if not axes or x.shape[dim] % math.prod(mesh.shape[a] for a in axes):
        return x
    spec = [rest] * x.ndim
    spec[dim] = axes
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))


def logits_from_hidden(cfg: ModelConfig, params: Params, hidden: jax.Array) -> jax.Array:
    """hidden [..., D] (after the final norm) -> float32 logits [..., V] (rows kept split over the batch axes
    under a mesh in context: `constrain_rows`; the vocabulary as XLA places it)."""
    dt = jnp.dtype(cfg.dtype)
    head = params["embed"].T if cfg.tie_embeddings else params["lm_head"]
    lead = hidden.shape[:-1]
    h = constrain_rows(hidden.astype(dt).reshape(-1, hidden.shape[-1]))
    logits = constrain_rows(head_matmul(h, head.astype(dt), cfg.matmul_precision), P.UNCONSTRAINED)
    return logits.reshape(*lead, -1)


def head_matmul(h: jax.Array, w: jax.Array, precision: str | None = None) -> jax.Array:
    """h [N,D] @ w [D,V] -> float32 logits, both inputs in the compute dtype. In bf16/fp16 the backward pass casts
    the float32 logits' gradient to that dtype first (autocast's rule), so both backward GEMMs run on the tensor
    cores: autodiff of the float32-output dot would upcast h and w and run two float32 (TF32) GEMMs, 16% of a
    Llama-3.2-1B training step on an H100 (128k vocabulary). float32 compute is autodiff's own."""
    if h.dtype == jnp.float32:
        return jnp.dot(h, w, precision=precision, preferred_element_type=jnp.float32)
    return _half_head_matmul(h, w, precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _half_head_matmul(h, w, precision):
    return jnp.dot(h, w, precision=precision, preferred_element_type=jnp.float32)


def _half_head_fwd(h, w, precision):  # symbolic zeros: h and w come as CustomVJPPrimal(value, perturbed)
    out = _half_head_matmul(h.value, w.value, precision)
    return out, (h.value, w.value, () if h.perturbed else None, () if w.perturbed else None)


def _half_head_bwd(precision, res, g):
    """Only the gradients asked for: a frozen head (LoRA) gets no [D,V] GEMM, as under autodiff."""
    h, w, want_h, want_w = res
    if isinstance(g, SymbolicZero):
        return None, None
    g = g.astype(h.dtype)
    dh = None if want_h is None else jnp.dot(g, w.T, precision=precision,
                                              preferred_element_type=jnp.float32).astype(h.dtype)
    dw = None if want_w is None else jnp.dot(h.T, g, precision=precision,
                                              preferred_element_type=jnp.float32).astype(w.dtype)
    return dh, dw


_half_head_matmul.defvjp(_half_head_fwd, _half_head_bwd, symbolic_zeros=True)


# ------------------------------------------------------------------------------------- full-sequence pass
def attention_mask(segment_ids: jax.Array) -> jax.Array:
    """[B,T] segment ids (0 = pad) -> [B,T,T] causal, same-segment mask."""
    T = segment_ids.shape[1]
    causal = jnp.tril(jnp.ones((T, T), bool))
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return causal[None] & same & (segment_ids[:, None, :] != 0)


def tree_mask(tree_exit: jax.Array) -> jax.Array:
    """[B,T] DFS interval ends of a prefix-tree pack (jaxrag.train.prefix_tree: a token's interval is [its index,
    tree_exit]) -> [B,T,T]: key j is visible to query i iff j <= i and i <= tree_exit[j] (j is i or an ancestor of
    i; the same as enter[j] <= enter[i] and exit[i] <= exit[j] with enter = index). A subset of the causal mask, so
    `block_causal_attention` still skips the upper triangle. Padding (exit = its own index) sees only itself."""
    T = tree_exit.shape[1]
    idx = jnp.arange(T, dtype=tree_exit.dtype)
    causal = idx[None, :] <= idx[:, None]
    return causal[None] & (idx[None, :, None] <= tree_exit[:, None, :])


def tree_attention_unsupported(cfg: ModelConfig) -> str | None:
    """Why the prefix-tree layout falls back to per-row batches on this backend, or None where it runs. The one
    place that says it: the XLA path (CPU, GPU without cuDNN) takes the tree mask in its blocks. TPU's splash kernel
    cannot (its masks are causal and segments). cuDNN flash attention would take it as the [B,1,T,T] mask it already
    takes for segments (added as a bias), but that path has not been run on a GPU with a tree mask here. So "auto"
    keeps per-row batches under splash and cuDNN; a forced tree runs the XLA path there (correct, no flash kernel)."""
    impl = resolve_attention_impl(cfg)
    if impl == "xla":
        return None
    if impl == "splash":
        return ("attention runs the Pallas splash kernel, whose masks are causal and segment ids (no tree of "
                "ancestors): per-row batches")
    return ("attention runs cuDNN flash attention, whose tree-mask path (a [B,1,T,T] bias) is untested on a GPU "
            "here: per-row batches")


def resolve_attention_impl(cfg: ModelConfig) -> str:
    """cfg.attention_impl with "auto" decided for this backend: "splash" on a TPU (one device, or a mesh in context:
    `tpu_attention.splash_fits`), "cudnn" on a GPU when the compute dtype is bf16/fp16 and head_dim is a multiple
    of 8 up to 128 (what cuDNN flash attention takes), else "xla". "splash" off a TPU runs only under
    `tpu_attention.interpret_mode()` (Pallas interpret mode: tests)."""
    impl, backend = cfg.attention_impl, jax.default_backend()
    half = cfg.dtype in ("bfloat16", "float16")
    fits = half and cfg.head_dim % 8 == 0 and cfg.head_dim <= 128
    if impl == "auto":
        if backend == "tpu":
            return "splash" if tpu_attention.splash_fits() else "xla"
        return "cudnn" if backend == "gpu" and fits else "xla"
    if impl == "splash" and backend != "tpu" and not tpu_attention.interpreting():
        raise ValueError(f"attention_impl='splash' needs a TPU backend (found {backend!r}); off a TPU it runs only "
                         "in Pallas interpret mode (jaxrag.models.tpu_attention.interpret_mode(), for tests); "
                         "use 'xla' or 'auto'")
    if impl == "cudnn" and (backend != "gpu" or not fits):
        raise ValueError(f"attention_impl='cudnn' needs a GPU backend (found {backend!r}), bf16/fp16 compute "
                         f"(dtype={cfg.dtype!r}) and head_dim a multiple of 8 <= 128 (head_dim={cfg.head_dim}); "
                         "use 'xla' or 'auto'")
    return impl


def fused_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None, implementation: str,
                    precision: str | None = None) -> jax.Array:
    """Causal GQA self-attention through `jax.nn.dot_product_attention`: q [B,T,H,Dh], k/v [B,T,K,Dh] -> [B,T,H,Dh].

    `is_causal=True` (the kernel skips the upper triangle), and with `segment_ids` a [B,1,T,T] same-segment mask
    (one per row, shared by the heads; cuDNN adds it as a bias) for packing and padding. Padding (segment 0)
    attends to padding, so no row is fully masked; real tokens never see it, which is all the callers read.
    No per-head [T,T] score tensor is materialized by the cudnn implementation."""
    mask = None
    if segment_ids is not None:
        mask = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
    with jax.default_matmul_precision(precision or "default"):
        return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True, implementation=implementation)


def causal_blocks(T: int, max_blocks: int = 4, min_block: int = 32) -> int:
    """How many query blocks `block_causal_attention` splits T into: the most (up to max_blocks) that divide T into
    blocks of at least min_block; 1 = no split."""
    return max([n for n in range(1, max_blocks + 1) if T % n == 0 and T // n >= min_block] or [1])


def block_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, precision: str | None = None,
                           n_blocks: int | None = None) -> jax.Array:
    """`attention` for a causal mask with the upper triangle's key blocks never computed: query block i (of n)
    attends to keys [0, (i+1)T/n) only. The same values (the skipped scores are all masked); in n blocks
    (n+1)/2n of the score matrix is computed. On XLA:CPU the demo's SFT step (16 x 256 tokens, 4 layers) took
    490 ms with 4 blocks, 520 with 8, 500 with 2 and 578 unsplit: more, smaller GEMMs stop paying."""
    T = q.shape[1]
    n = causal_blocks(T) if n_blocks is None else n_blocks
    if n <= 1:
        return attention(q, k, v, mask, precision)
    b = T // n
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    return jnp.concatenate([attend(q[:, i * b:(i + 1) * b], kh[:, :, :(i + 1) * b], vh[:, :, :(i + 1) * b],
                                   mask[:, i * b:(i + 1) * b, :(i + 1) * b], precision) for i in range(n)], axis=1)


def self_attention(cfg: ModelConfig, q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None,
                   tree_exit: jax.Array | None = None) -> jax.Array:
    """Full-sequence causal attention by `resolve_attention_impl(cfg)`; segment_ids None = one unpadded segment.
    The "xla" implementation skips the upper triangle's key blocks (`block_causal_attention`); "splash" is the
    Pallas TPU kernel (`tpu_attention.splash_attention`). With `tree_exit` (a prefix-tree pack) each token attends
    to its ancestors only (`tree_mask`), on the XLA path on every backend (`tree_attention_unsupported`)."""
    if tree_exit is not None:
        return block_causal_attention(q, k, v, tree_mask(tree_exit), cfg.matmul_precision)
    impl = resolve_attention_impl(cfg)
    if impl == "xla":
        if segment_ids is None:
            segment_ids = jnp.ones(q.shape[:2], jnp.int32)
        return block_causal_attention(q, k, v, attention_mask(segment_ids), cfg.matmul_precision)
    if impl == "splash":
        return tpu_attention.splash_attention(q, k, v, segment_ids)
    return fused_attention(q, k, v, segment_ids, "cudnn" if impl == "cudnn" else "xla", cfg.matmul_precision)


def unstack_layers(params: Params) -> Params:
    """The same params with "layers" as a tuple of per-layer dicts (the [L,...] leaves split into L arrays).

    Every model function takes either layout. Stacked layers run under `lax.scan` (compile time flat in depth:
    training, prefill); unstacked ones run as an unrolled loop whose weights are whole buffers. Decode wants the
    latter: XLA (CPU, and GPU without dynamic-slice fusion) copies each layer's slice of a stacked weight before
    its matmul, so a bandwidth-bound decode step over stacked weights moves about 3x the weight bytes (the
    unscanned-layers inference setting of MaxText, `scan_layers=False`). Costs one copy of the layer weights."""
    layers = params["layers"]
    if isinstance(layers, (tuple, list)):
        return params
    return {**params, "layers": _split_layers(layers)}


@jax.jit
def _split_layers(layers: dict) -> tuple:
    """[L,...] leaves -> L per-layer dicts; one jit for every call (compiled once per shape), since the RL loop
    re-splits the updated params after every optimizer step."""
    n = next(iter(layers.values())).shape[0]
    return tuple({k: w[i] for k, w in layers.items()} for i in range(n))


def layer_params(params: Params, i: int) -> Params:
    """Layer i's weights from either layout (a static slice of the stacked leaves)."""
    layers = params["layers"]
    return layers[i] if isinstance(layers, (tuple, list)) else {k: w[i] for k, w in layers.items()}


def scan_layers(cfg: ModelConfig) -> bool:
    """cfg.scan_layers with None decided for this backend: unrolled (False) on a GPU, scanned elsewhere."""
    return cfg.scan_layers if cfg.scan_layers is not None else jax.default_backend() != "gpu"


def _slices(layers: dict) -> tuple:
    """[L,...] leaves -> L per-layer dicts inside a trace, by `jnp.split`: its transpose is one concatenate, so the
    gradient of the stacked leaves is assembled once instead of summed from L zero-padded slices."""
    n = next(iter(layers.values())).shape[0]
    parts = {k: [jnp.squeeze(p, 0) for p in jnp.split(w, n, axis=0)] for k, w in layers.items()}
    return tuple({k: parts[k][i] for k in layers} for i in range(n))


def _run_layers(params: Params, x: jax.Array, body, remat: bool = False, scan: bool = True):
    """x through every layer with body(x, layer_params) -> (x, y): lax.scan over stacked layers (with scan), an
    unrolled loop over unstacked ones or over the stacked leaves' slices. Returns (x, ys) with ys stacked over
    layers (None when the body returns None)."""
    if remat:
        body = jax.checkpoint(body, policy=jax.checkpoint_policies.nothing_saveable)
    layers = params["layers"]
    if not isinstance(layers, (tuple, list)):
        if scan:
            return jax.lax.scan(body, x, layers)
        layers = _slices(layers)
    ys = []
    for lp in layers:
        x, y = body(x, lp)
        ys.append(y)
    return x, (None if ys[0] is None else jax.tree.map(lambda *a: jnp.stack(a), *ys))


def forward_hidden(cfg: ModelConfig, params: Params, tokens, positions=None, segment_ids=None, *, remat=False,
                   tree_exit=None):
    """tokens [B,T] -> final-normed hidden states [B,T,D] in the compute dtype. tree_exit [B,T]: the rows are
    prefix-tree packs (jaxrag.train.prefix_tree), each token attending to its ancestors (`tree_mask`).

    Args:
      cfg: the model config.
      params: the params pytree.
      tokens: [B, T] int32 token ids.
      positions: [B, T] int32 RoPE positions; None = 0..T-1 in every row.
      segment_ids: [B, T] int32 segment ids, 0 = padding; None = one unpadded segment per row.
      remat: rematerialize each layer in the backward pass (jax.checkpoint).
      tree_exit: [B, T] int32 DFS interval ends of prefix-tree packs; None = causal, same-segment attention.

    Returns:
      [B, T, D] final-normed hidden states in cfg.dtype.
    """
    hidden, _ = _forward_kv(cfg, params, tokens, positions, segment_ids, remat=remat, tree_exit=tree_exit)
    return hidden


def _forward_kv(cfg, params, tokens, positions=None, segment_ids=None, *, remat=False, kv_dtype=None,
                tree_exit=None):
    """forward_hidden, and with kv_dtype each layer's keys/values [L,B,K,T,Dh] (head-major, in kv_dtype)."""
    B, T = tokens.shape
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    inv_freq = jnp.asarray(rope_inv_freq(cfg))

    def layer(x, lp):
        lp = _cast_layer(cfg, lp)
        h = rms_norm(x, lp["attn_norm"], cfg.rms_eps)
        q, k, v = _project_qkv(cfg, lp, h, positions, inv_freq)
        x = constrain_rows(_attn_out_and_mlp(cfg, lp, x, self_attention(cfg, q, k, v, segment_ids, tree_exit)))
        if kv_dtype is None:
            return x, None
        return x, (k.transpose(0, 2, 1, 3).astype(kv_dtype), v.transpose(0, 2, 1, 3).astype(kv_dtype))

    x, kv = _run_layers(params, constrain_rows(_embed(cfg, params, tokens)), layer, remat, scan_layers(cfg))
    return constrain_rows(rms_norm(x, params["final_norm"], cfg.rms_eps)), kv


def forward(cfg: ModelConfig, params: Params, tokens, positions=None, segment_ids=None, *, return_hidden=False, remat=False):
    """tokens [B,T] -> float32 logits [B,T,V] (and the final hidden states [B,T,D] if return_hidden).

    Args:
      cfg: the model config.
      params: the params pytree.
      tokens: [B, T] int32 token ids.
      positions: [B, T] int32 RoPE positions; None = 0..T-1 in every row.
      segment_ids: [B, T] int32 segment ids, 0 = padding; None = one unpadded segment per row.
      return_hidden: also return the final-normed hidden states.
      remat: rematerialize each layer in the backward pass (jax.checkpoint).

    Returns:
      logits [B, T, V] float32, or (logits, hidden [B, T, D]) if return_hidden.
    """
    hidden = forward_hidden(cfg, params, tokens, positions, segment_ids, remat=remat)
    logits = logits_from_hidden(cfg, params, hidden)
    return (logits, hidden) if return_hidden else logits


# --------------------------------------------------------------------------------------------- KV cache
def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> dict:
    """k/v: tuples of L per-layer buffers [B,K,S,Dh] (head-major: the layout the attention GEMMs read, so decode
    reads each buffer in place and writes one slot of it), valid [B,S] (slot holds a real token), index (next slot
    to write). dtype: `dtype`, else cfg.cache_dtype, else the compute dtype.

    Args:
      cfg: the model config.
      batch: B, the rows.
      max_len: S, the cache slots per row.
      dtype: the k/v dtype; None = cfg.cache_dtype, else cfg.dtype.

    Returns:
      An empty cache dict: k, v, valid, index (0).
    """
    dt = jnp.dtype(dtype or cfg.cache_dtype or cfg.dtype)
    shape = (batch, cfg.n_kv_heads, max_len, cfg.head_dim)
    return {
        "k": tuple(jnp.zeros(shape, dt) for _ in range(cfg.n_layers)),
        "v": tuple(jnp.zeros(shape, dt) for _ in range(cfg.n_layers)),
        "valid": jnp.zeros((batch, max_len), bool),
        "index": jnp.zeros((), jnp.int32),
    }


def forward_cached(cfg: ModelConfig, params: Params, tokens, positions, token_valid, cache):
    """Run T new tokens per row through the model, writing their keys/values at cache slots [index, index+T).

    tokens/positions/token_valid [B,T]. A new token at slot s attends to valid slots <= s. Decode (T = 1) and
    continuing a cache with more tokens are this one function; layers run as an unrolled loop so each layer's
    cache buffer is updated in place (dynamic_update_slice under donation) and read where it lies: all of it, or
    with cfg.cache_block only its filled window (`attend_window`) when that window's blocks cover at most half the
    cache (a traced choice: XLA:CPU copies each block it slices, so a window costs about twice a slot of one pass).
    A cache with a "prefix" entry (generate.cascade_cache: k/v tuples [U,K,P,Dh], valid [U,P]) holds rows that
    continue shared prefixes, rows [u*m, (u+1)*m) prefix u: each row attends to its prefix, then to its own slots
    (`attend_shared`); the prefix passes through unchanged.

    Args:
      cfg: the model config.
      params: the params pytree.
      tokens: [B, T] int32 new token ids.
      positions: [B, T] int32 RoPE positions of the new tokens.
      token_valid: [B, T] bool, False on padding tokens.
      cache: the cache dict (init_cache, prefill or a previous call).

    Returns:
      (logits [B, T, V] float32, new cache).
    """
    hidden, cache = forward_cached_hidden(cfg, params, tokens, positions, token_valid, cache)
    return logits_from_hidden(cfg, params, hidden), cache


def forward_cached_hidden(cfg: ModelConfig, params: Params, tokens, positions, token_valid, cache):
    """`forward_cached` up to the final-normed hidden states [B,T,D] (a critic head reads these)."""
    B, T = tokens.shape
    S = cache["valid"].shape[1]
    start = cache["index"]
    valid = jax.lax.dynamic_update_slice(cache["valid"], token_valid.astype(bool), (0, start))
    query_slots = start + jnp.arange(T)
    mask = (jnp.arange(S)[None, :] <= query_slots[:, None])[None] & valid[:, None, :]  # [B,T,S]
    attn = lambda i, q, k, v: attend(q, k, v, mask, cfg.matmul_precision)
    shared = cache.get("prefix")
    block = 0 if shared else cache_block(cfg, S)
    if shared:   # rows continue shared prefixes (generate.cascade_cache): each prefix read once per group
        attn = lambda i, q, k, v: attend_shared(q, k, v, mask, shared["k"][i], shared["v"][i], shared["valid"],
                                                cfg.matmul_precision)
    if block:   # the filled window (from the first slot any row holds) where its blocks cover at most half the cache
        lo = jnp.argmax(jnp.any(valid, axis=0))
        windowed = 2 * window_blocks(lo, start + T, block)[1] * block <= S
        one_pass = attn
        attn = lambda i, q, k, v: jax.lax.cond(
            windowed, lambda: attend_window(q, k, v, valid, query_slots, lo, block, cfg.matmul_precision),
            lambda: one_pass(i, q, k, v))
    inv_freq = jnp.asarray(rope_inv_freq(cfg))
    x = _embed(cfg, params, tokens)
    ks, vs = list(cache["k"]), list(cache["v"])
    for i in range(cfg.n_layers):
        lp = _cast_layer(cfg, layer_params(params, i))
        h = rms_norm(x, lp["attn_norm"], cfg.rms_eps)
        q, k, v = _project_qkv(cfg, lp, h, positions, inv_freq)
        ks[i] = jax.lax.dynamic_update_slice(ks[i], k.transpose(0, 2, 1, 3).astype(ks[i].dtype), (0, 0, start, 0))
        vs[i] = jax.lax.dynamic_update_slice(vs[i], v.transpose(0, 2, 1, 3).astype(vs[i].dtype), (0, 0, start, 0))
        x = _attn_out_and_mlp(cfg, lp, x, attn(i, q, ks[i], vs[i]))
    hidden = rms_norm(x, params["final_norm"], cfg.rms_eps)
    out = {"k": tuple(ks), "v": tuple(vs), "valid": valid, "index": start + T}
    return hidden, (dict(out, prefix=shared) if shared else out)


def prefill(cfg: ModelConfig, params: Params, tokens, positions, token_valid, cache):
    """Prompt pass into an EMPTY cache (index 0): returns (logits of the last column [B,V], cache).

    Prompts are left-padded; the pass is the full-sequence forward (scan over stacked layers, the fused attention
    path where configured, attention over the T prompt tokens only: padding is segment 0), whose per-layer
    keys/values are then written at slots [0, T).

    Args:
      cfg: the model config.
      params: the params pytree.
      tokens: [B, T] int32 left-padded prompt ids.
      positions: [B, T] int32 RoPE positions.
      token_valid: [B, T] bool, False on padding.
      cache: an empty cache (init_cache) with S >= T slots.

    Returns:
      (logits [B, V] float32 of the last prompt column, cache with slots [0, T) filled and index T).
    """
    seg = token_valid.astype(jnp.int32)
    hidden, (k_new, v_new) = _forward_kv(cfg, params, tokens, positions, seg, kv_dtype=cache["k"][0].dtype)
    T = tokens.shape[1]
    put = lambda buf, new: jax.lax.dynamic_update_slice(buf, new, (0, 0, 0, 0))
    cache = {"k": tuple(put(b, k_new[i]) for i, b in enumerate(cache["k"])),
             "v": tuple(put(b, v_new[i]) for i, b in enumerate(cache["v"])),
             "valid": jax.lax.dynamic_update_slice(cache["valid"], token_valid.astype(bool), (0, 0)),
             "index": jnp.asarray(T, jnp.int32)}
    return logits_from_hidden(cfg, params, hidden[:, -1]), cache


def decode_step(cfg: ModelConfig, params: Params, token, position, cache):
    """One token per row: token/position [B] -> (logits [B,V], cache).

    Args:
      cfg: the model config.
      params: the params pytree.
      token: [B] int32 token ids.
      position: [B] int32 RoPE positions.
      cache: the cache dict; the token is written at its slot `index`.

    Returns:
      (logits [B, V] float32, new cache).
    """
    logits, cache = forward_cached(
        cfg, params, token[:, None], position[:, None], jnp.ones_like(token, bool)[:, None], cache
    )
    return logits[:, 0], cache


# ----------------------------------------------------------------------------------------------- critic
def critic_init(cfg: ModelConfig, key: jax.Array) -> Params:
    """Scalar reward/value head on the backbone's final hidden state."""
    return {"w": (jax.random.normal(key, (cfg.d_model,), jnp.float32) / math.sqrt(cfg.d_model)), "b": jnp.zeros((), jnp.float32)}


def critic_scores(cfg: ModelConfig, params: Params, head: Params, tokens, positions=None, segment_ids=None, read_index=None, *, remat=False):
    """Scalar score per row read at `read_index[B]` (default: the last column) -> [B] float32.

    Args:
      cfg: the model config.
      params: the backbone params pytree.
      head: the critic head (critic_init): w [D], b [].
      tokens: [B, T] int32 token ids.
      positions: [B, T] int32 RoPE positions; None = 0..T-1.
      segment_ids: [B, T] int32 segment ids, 0 = padding; None = one unpadded segment per row.
      read_index: [B] int column whose hidden state is scored; None = T-1.
      remat: rematerialize each layer in the backward pass.

    Returns:
      [B] float32 scores.
    """
    hidden = forward_hidden(cfg, params, tokens, positions, segment_ids, remat=remat).astype(jnp.float32)
    if read_index is None:
        read_index = jnp.full((tokens.shape[0],), tokens.shape[1] - 1)
    h = jnp.take_along_axis(hidden, read_index[:, None, None].astype(jnp.int32), axis=1)[:, 0]
    return h @ head["w"] + head["b"]
