"""Device mesh (data, fsdp, tensor), logical-axis rules, and placing params / batches on the mesh.

The same code runs on 1 CPU, 8 fake CPU devices and a TPU/GPU slice: only the mesh shape changes.
- Params: each leaf's logical axes (jaxrag.models.param_logical_axes) are mapped through `rules` to mesh axes.
  A dimension that the mesh axis size does not divide stays replicated (e.g. 2 kv heads on tensor=4).
- Batches: leading (batch) axis split over data x fsdp; everything else replicated.
- Optimizer state: each leaf takes the sharding of the parameter it mirrors (matched by key-path suffix and shape).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# logical axis name -> mesh axis (or None: replicated)
DEFAULT_RULES: dict[str, str | None] = {
    "batch": BATCH_AXES,  # type: ignore[dict-item]
    "layers": None,
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "lora_rank": None,
}


def make_mesh(shape: Sequence[int] = (-1, 1, 1), devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Mesh over (data, fsdp, tensor). One entry may be -1 (all remaining devices)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = list(shape)
    if len(shape) != 3:
        raise ValueError(f"mesh shape {tuple(shape)} must have 3 entries (data, fsdp, tensor)")
    if shape.count(-1) > 1:
        raise ValueError(f"mesh shape {tuple(shape)}: at most one entry may be -1")
    if -1 in shape:
        rest = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = len(devices) // max(rest, 1)
    if math.prod(shape) != len(devices):
        raise ValueError(f"mesh shape {tuple(shape)} needs {math.prod(shape)} devices; {len(devices)} available")
    return Mesh(np.asarray(devices, dtype=object).reshape(shape), MESH_AXES)


def logical_to_spec(logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules: Mapping[str, Any] = DEFAULT_RULES) -> P:
    """PartitionSpec for one array; a mesh axis is used at most once and only where it divides the dimension."""
    used: set[str] = set()
    spec = []
    for name, dim in zip(logical, shape):
        target = rules.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a not in used and mesh.shape[a] > 1)
        size = math.prod(mesh.shape[a] for a in axes)
        if not axes or dim % size:
            spec.append(None)
            continue
        used.update(axes)
        spec.append(axes[0] if len(axes) == 1 else axes)
    return P(*spec)


def param_shardings(mesh: Mesh, shapes: Any, logical_axes: Any, rules: Mapping[str, Any] = DEFAULT_RULES) -> Any:
    """Tree of NamedSharding for `shapes` (arrays or ShapeDtypeStructs) with the matching logical-axes tree."""
    is_axes = lambda x: isinstance(x, tuple) and all(isinstance(a, (str, type(None))) for a in x)
    flat_axes = jax.tree.leaves(logical_axes, is_leaf=is_axes)
    flat_shapes, treedef = jax.tree.flatten(shapes)
    if len(flat_axes) != len(flat_shapes):
        raise ValueError(f"logical axes tree has {len(flat_axes)} leaves, params tree {len(flat_shapes)}")
    out = []
    for ax, x in zip(flat_axes, flat_shapes):
        if len(ax) != len(x.shape):
            raise ValueError(f"logical axes {ax} do not match a param of shape {x.shape}")
        out.append(NamedSharding(mesh, logical_to_spec(ax, x.shape, mesh, rules)))
    return jax.tree.unflatten(treedef, out)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh, ndim: int = 1) -> NamedSharding:
    return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def batch_shardings(mesh: Mesh, batch: Any) -> Any:
    return jax.tree.map(lambda x: batch_sharding(mesh, np.ndim(x)), batch)


def shard_batch(mesh: Mesh, batch: Any) -> Any:
    """Host numpy batch (the same global batch on every process) -> global jax arrays split over data x fsdp."""
    n = mesh.shape["data"] * mesh.shape["fsdp"]

    def put(x):
        x = np.asarray(x)
        if x.shape[0] % n:
            raise ValueError(f"batch dimension {x.shape[0]} is not divisible by data x fsdp = {n}")
        sharding = batch_sharding(mesh, x.ndim)
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

    return jax.tree.map(put, batch)


def like_params_shardings(mesh: Mesh, tree: Any, params_shardings: Any, params_shapes: Any) -> Any:
    """Shardings for a tree whose leaves mirror params (optimizer moments): a leaf whose key path ends with a
    param's key path and has that param's shape gets the param's sharding; every other leaf is replicated."""
    by_path = {}
    for (path, sh), x in zip(jax.tree_util.tree_leaves_with_path(params_shardings), jax.tree.leaves(params_shapes)):
        by_path[tuple(path)] = (sh, tuple(x.shape))

    def pick(path, leaf):
        path = tuple(path)
        for start in range(len(path)):
            hit = by_path.get(path[start:])
            if hit is not None and hit[1] == tuple(np.shape(leaf)):
                return hit[0]
        return replicated(mesh)

    return jax.tree_util.tree_map_with_path(pick, tree)


def abstract(tree: Any, shardings: Any | None = None) -> Any:
    """ShapeDtypeStructs (with shardings) for a tree of arrays / shapes: AOT lowering without allocation."""
    if shardings is None:
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), tree)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s), tree, shardings)


# ------------------------------------------------------------------------------------------------ decode layout
# Decoding splits the batch's rows over data x fsdp (each device holds and decodes B/n rows of the KV cache); the
# weights are either whole on every device, or split over the tensor axis only (never over fsdp: an fsdp-sharded
# weight is gathered by every decode step, a weight's bytes per step instead of once per RL step).
DECODE_TENSOR_RULES: dict[str, str | None] = {"vocab": "tensor", "heads": "tensor", "kv_heads": "tensor",
                                              "mlp": "tensor"}
WEIGHT_FRACTION = 0.5   # the share of a device's memory the weights may take when chosen replicated (the rest: cache)


class DecodeMemoryError(ValueError):
    """A decode layout that cannot fit a device's memory (raised before anything is compiled)."""


def gib(n: float) -> str:
    return f"{n / 2 ** 30:.2f} GiB"


@dataclasses.dataclass(frozen=True)
class DecodeLayout:
    """Where a decode puts its arrays: rows over data x fsdp of `mesh`; weights "replicated" or "tensor" (over the
    tensor axis), or "as placed" (the params' own shardings, for params placed by the caller). budget_bytes: memory
    per device the weights and KV cache may take; None = what the device reports (nothing on CPU: no check)."""
    mesh: Mesh
    weights: str = "replicated"
    budget_bytes: int | None = None

    @property
    def n_rows(self) -> int:
        """Devices the rows are split over (data x fsdp): a decode batch is padded to a multiple of this."""
        return self.mesh.shape["data"] * self.mesh.shape["fsdp"]

    def pad(self, rows: int) -> int:
        return -(-rows // self.n_rows) * self.n_rows

    def budget(self) -> int | None:
        return self.budget_bytes if self.budget_bytes is not None else device_budget(self.mesh)

    def weight_shardings(self, shapes: Any, logical_axes: Any) -> Any:
        if self.weights == "replicated":
            return jax.tree.map(lambda _: replicated(self.mesh), shapes)
        return param_shardings(self.mesh, shapes, logical_axes, DECODE_TENSOR_RULES)


def rows_spec(ndim: int) -> P:
    """A batch-major array's spec in a decode: rows over data x fsdp, the rest whole; scalars replicated."""
    return P(BATCH_AXES, *([None] * (ndim - 1))) if ndim else P()


def device_budget(mesh: Mesh) -> int | None:
    """The smallest memory limit the mesh's devices report (accelerators), None where they report none (CPU)."""
    limits = [(d.memory_stats() or {}).get("bytes_limit") for d in mesh.devices.flat]
    return None if any(x is None for x in limits) else int(min(limits))


def bytes_per_device(shapes: Any, shardings: Any) -> int:
    """Bytes of one device's shard of every leaf (the largest shard where a dimension splits unevenly)."""
    total = 0
    for x, s in zip(jax.tree.leaves(shapes), jax.tree.leaves(shardings)):
        total += math.prod(s.shard_shape(tuple(x.shape))) * np.dtype(x.dtype).itemsize
    return total


def choose_decode_layout(mesh: Mesh, shapes: Any, logical_axes: Any, *, budget_bytes: int | None = None,
                         weight_fraction: float = WEIGHT_FRACTION) -> DecodeLayout:
    """The weights' decode layout: replicated where they take at most `weight_fraction` of a device's budget,
    else split over the tensor axis where that fits; else DecodeMemoryError naming the bytes (no budget known:
    replicated)."""
    rep = DecodeLayout(mesh, "replicated", budget_bytes)
    budget = rep.budget()
    if budget is None:
        return rep
    whole = bytes_per_device(shapes, rep.weight_shardings(shapes, logical_axes))
    if whole <= weight_fraction * budget:
        return rep
    tp = DecodeLayout(mesh, "tensor", budget_bytes)
    split = bytes_per_device(shapes, tp.weight_shardings(shapes, logical_axes))
    if mesh.shape["tensor"] > 1 and split <= weight_fraction * budget:
        return tp
    raise DecodeMemoryError(
        f"decode layout: the weights take {gib(whole)} per device replicated, {gib(split)} over tensor="
        f"{mesh.shape['tensor']}; more than {weight_fraction:.0%} of the {gib(budget)} budget per device: "
        f"use a mesh with a larger tensor axis")


def check_decode_memory(layout: DecodeLayout, weights_bytes: int, cache_bytes: int, what: str) -> None:
    """Refuse, before compiling, a decode whose weights + KV cache per device exceed the layout's budget."""
    budget = layout.budget()
    if budget is not None and weights_bytes + cache_bytes > budget:
        raise DecodeMemoryError(
            f"decode memory: {what}: weights {gib(weights_bytes)} ({layout.weights}) + KV cache {gib(cache_bytes)}"
            f" = {gib(weights_bytes + cache_bytes)} per device > the {gib(budget)} budget; decode fewer rows a "
            f"call, fewer new tokens, or split rows / weights over more devices")
