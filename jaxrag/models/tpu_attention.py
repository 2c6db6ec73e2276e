"""Attention on TPU: the Pallas splash-attention kernel for full-sequence passes (training, prefill), and the
choice of the XLA filled-window path for cache attention (decode).

Full-sequence passes (`splash_attention`). JAX's splash attention (jax.experimental.pallas.ops.tpu.splash_attention)
computes causal attention block by block in VMEM without materializing the [T, S] scores, and skips the blocks
that the causal mask leaves empty; its custom VJP runs the dq and dkv kernels the same way. jaxrag's masks map onto
it exactly: causal AND same segment id (packed sequences), with padding as segment 0. Real tokens never attend to
padding (their ids differ); padding attends causally to earlier padding, so no row is fully masked (the kernel
requires that), and padding rows are never read, as in the XLA path. GQA: the kernel takes kv heads [K,T,Dh] with
query head h reading kv head h // (H/K), which is jaxrag's head order (`stack_query_heads`). The kernel does not
scale; q is multiplied by 1/sqrt(Dh) first (the XLA path divides the fp32 scores instead: equal up to rounding of
q in the compute dtype). Block sizes must be multiples of 128 that divide the sequence: T is padded up to a
multiple of 128 with padding (segment 0) and the kernel runs on the largest of 512/256/128 that divides it.

Meshes. A pallas_call is not partitioned by XLA: under a multi-device jit without a mesh in context it would
gather q/k/v onto every device. With a mesh in context (`jax.set_mesh(mesh)`), the kernel runs
under `jax.shard_map`, batch over the batch axes (data, fsdp) and heads over `tensor` where those axes divide them;
on several devices with no mesh in context, `"auto"` keeps the XLA path (`splash_fits`).

Decode (`DECODE_CACHE_BLOCK`). The Pallas decode kernels that ship with JAX (paged_attention, ragged_paged_attention)
read a paged cache: pages [K, P, page_size, Dh] (or [P, page_size, 2K, Dh]) named per sequence by a page table,
each sequence's keys filling [0, length). jaxrag's cache is contiguous per row, [B, K, S, Dh] per layer, with a
validity mask [B, S] that has holes (left-padded prompts, rows of a continuous pool at different steps, sessions
appended at offsets) and a shared write index; decode may also feed T > 1 new tokens (session continuation).
Neither kernel can read that without copying the cache into pages every step (B is the leading axis, not K) and
neither takes a per-slot mask, so decode stays on the XLA path: on TPU, "auto" reads only the cache's filled window
(`transformer.attend_window`), `DECODE_CACHE_BLOCK` slots at a time, in caches of at least 8 such blocks while the
window covers at most half the cache (decode is bandwidth-bound: it reads the slots the rows hold, not the cache).

On CPU the kernels run in Pallas' TPU interpret mode (`interpret_mode()`: tests); the TPU numbers are unmeasured
here (see docs/tpu_attention.md).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

LANES = 128                   # splash blocks (q and kv) must be multiples of the TPU lane width
BLOCKS = (512, 256, LANES)    # block sizes tried, largest first
DECODE_CACHE_BLOCK = 256      # slots per block of the filled-window decode path on TPU (transformer.cache_block)
BATCH_AXES, HEAD_AXIS = ("data", "fsdp"), "tensor"   # jaxrag.sharding's mesh axes (models sits below sharding)

_INTERPRET = contextvars.ContextVar("jaxrag_tpu_interpret", default=False)


@contextlib.contextmanager
def interpret_mode(params=True):
    """Run the TPU Pallas kernels interpreted inside this context, on any backend (CPU tests). params: True = the
    HLO interpreter (the kernel's body run as jax ops over its grid); a `pltpu.InterpretParams` = the TPU
    interpreter (simulated VMEM/DMAs, out-of-bounds reads raise, uninitialized memory is NaN), which in JAX 0.10.2
    fails on a vmapped pallas_call (its grid gains the batch axis, its dimension_semantics do not; Mosaic's own
    lowering adds them), so it runs the per-example kernel only. Jit inside the context: a program traced
    outside it keeps the compiled kernel."""
    from jax.experimental.pallas import tpu as pltpu
    token = _INTERPRET.set(True)
    try:
        with pltpu.force_tpu_interpret_mode(params):
            yield
    finally:
        _INTERPRET.reset(token)


def interpreting() -> bool:
    """Whether `interpret_mode` is active (then "splash" runs off a TPU)."""
    return _INTERPRET.get()


def padded_length(T: int) -> int:
    """T rounded up to a multiple of the lane width (the smallest splash block)."""
    return -(-T // LANES) * LANES


def block_size(T_padded: int) -> int:
    """The largest of BLOCKS dividing T_padded (a multiple of LANES)."""
    return next(b for b in BLOCKS if T_padded % b == 0)


@functools.lru_cache(maxsize=64)
def _kernel(n_heads: int, T: int, block: int):
    """The splash kernel (causal, every head) for [n_heads, T, Dh] queries; its block-sparsity tables are built
    once per (heads, length, block), as concrete arrays even when first asked for inside a trace (a cached tracer
    would leak into the next trace)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa
    mask = sa.MultiHeadMask([sa.CausalMask((T, T)) for _ in range(n_heads)])
    sizes = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                          block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    with jax.ensure_compile_time_eval():
        return sa.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1)


def _splash_local(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
    """splash_attention on the arrays this device holds: q [B,T,H,Dh], k/v [B,T,K,Dh], segment_ids [B,T] or None."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa
    B, T, H, Dh = q.shape
    Tp = padded_length(T)
    pad = lambda x: jnp.pad(x, ((0, 0), (0, Tp - T)) + ((0, 0),) * (x.ndim - 2)) if Tp != T else x
    qh = pad(q * jnp.asarray(1.0 / math.sqrt(Dh), q.dtype)).transpose(0, 2, 1, 3)   # [B,H,Tp,Dh]
    kh, vh = pad(k).transpose(0, 2, 1, 3), pad(v).transpose(0, 2, 1, 3)             # [B,K,Tp,Dh]
    kernel = _kernel(H, Tp, block_size(Tp))
    if segment_ids is None and Tp == T:
        out = jax.vmap(kernel)(qh, kh, vh)
    else:
        seg = pad(jnp.ones((B, T), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32))
        out = jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=sa.SegmentIds(s, s)))(qh, kh, vh, seg)
    return out.transpose(0, 2, 1, 3)[:, :T].astype(q.dtype)


def _mesh_specs(mesh, B: int, K: int):
    """(batch axes, head axis) of `mesh` that divide the batch B and the kv heads K; unsplit where they do not."""
    batch = tuple(a for a in BATCH_AXES if a in mesh.axis_names and mesh.shape[a] > 1)
    if batch and B % math.prod(mesh.shape[a] for a in batch):
        batch = ()
    head = HEAD_AXIS if HEAD_AXIS in mesh.axis_names and mesh.shape[HEAD_AXIS] > 1 else None
    if head and K % mesh.shape[head]:
        head = None
    return (batch or None), head


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
    """Causal GQA self-attention by the Pallas splash kernel: q [B,T,H,Dh], k/v [B,T,K,Dh], segment_ids [B,T]
    (0 = padding; None = one unpadded segment) -> [B,T,H,Dh] in q's dtype. Same values as the XLA path on every
    real token (padding rows differ and are never read). Under a mesh in context: per shard (module docstring)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return _splash_local(q, k, v, segment_ids)
    batch, head = _mesh_specs(mesh, q.shape[0], k.shape[2])
    qkv = P(batch, None, head, None)
    if segment_ids is None:
        fn, args, specs = (lambda q, k, v: _splash_local(q, k, v, None)), (q, k, v), (qkv, qkv, qkv)
    else:
        fn, args, specs = _splash_local, (q, k, v, segment_ids), (qkv, qkv, qkv, P(batch, None))
    return jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=qkv, check_vma=False)(*args)


def splash_fits() -> bool:
    """Whether "auto" takes splash on this TPU process: one device, or a mesh in context to split the kernel over
    (without one, XLA would gather every layer's q/k/v onto each device: the XLA path is then the better choice)."""
    mesh = jax.sharding.get_abstract_mesh()
    return jax.device_count() == 1 or not mesh.empty
