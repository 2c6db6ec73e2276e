"""LoRA adapters over the stacked projection weights, as a separate pytree.

adapters = {"wq": {"a": [L,D,r], "b": [L,r,H,Dh]}, "wo": {"a": [L,H,Dh,r], "b": [L,r,D]}, ...}
`apply_lora(params, adapters, scale)` returns params with effective weights W + scale·A@B (scale = alpha/r), computed
inside the jitted loss; the base params are never copied or changed, so the DPO/GRPO reference is simply the base
params (adapters off). B starts at zero: at step 0 the adapted model equals the base.

Dropout: the weights are merged before the matmul, so dropout is applied to the adapter's input features (one
mask over A's input rows per step and layer) instead of per token as in PEFT: a documented approximation.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp

from jaxrag.models import save_hf
from jaxrag.models.config import ModelConfig

TARGETS = {"q": "wq", "k": "wk", "v": "wv", "o": "wo", "gate": "w_gate", "up": "w_up", "down": "w_down"}


def _io(cfg: ModelConfig, name: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...], tuple[str, ...]]:
    """(input dims, output dims, their logical names) of one projection, without the layer axis."""
    D, H, K, Dh, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    return {
        "wq": ((D,), (H, Dh), ("embed",), ("heads", "head_dim")),
        "wk": ((D,), (K, Dh), ("embed",), ("kv_heads", "head_dim")),
        "wv": ((D,), (K, Dh), ("embed",), ("kv_heads", "head_dim")),
        "wo": ((H, Dh), (D,), ("heads", "head_dim"), ("embed",)),
        "w_gate": ((D,), (F,), ("embed",), ("mlp",)),
        "w_up": ((D,), (F,), ("embed",), ("mlp",)),
        "w_down": ((F,), (D,), ("mlp",), ("embed",)),
    }[name]


def _param_names(targets: Sequence[str]) -> list[str]:
    bad = [t for t in targets if t not in TARGETS]
    if bad:
        raise ValueError(f"unknown LoRA targets {bad}; choose from {tuple(TARGETS)}")
    if not targets:
        raise ValueError("LoRA needs at least one target projection")
    return [TARGETS[t] for t in targets]


def lora_shapes(cfg: ModelConfig, targets: Sequence[str], rank: int) -> dict:
    out = {}
    for name in _param_names(targets):
        ins, outs, _, _ = _io(cfg, name)
        out[name] = {"a": (cfg.n_layers, *ins, rank), "b": (cfg.n_layers, rank, *outs)}
    return out


def init_lora(cfg: ModelConfig, key: jax.Array, targets: Sequence[str] = ("q", "k", "v"), rank: int = 8, dtype=jnp.float32) -> dict:
    """A ~ N(0, 1/fan_in), B = 0."""
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    shapes = lora_shapes(cfg, targets, rank)
    keys = jax.random.split(key, len(shapes))
    out = {}
    for k, (name, s) in zip(keys, shapes.items()):
        fan_in = math.prod(s["a"][1:-1])
        out[name] = {
            "a": (jax.random.normal(k, s["a"], jnp.float32) / math.sqrt(fan_in)).astype(dtype),
            "b": jnp.zeros(s["b"], dtype),
        }
    return out


def lora_logical_axes(cfg: ModelConfig, adapters: dict) -> dict:
    out = {}
    for name in adapters:
        _, _, lin, lout = _io(cfg, name)
        out[name] = {"a": ("layers", *lin, "lora_rank"), "b": ("layers", "lora_rank", *lout)}
    return out


def delta(adapter: dict) -> jax.Array:
    """A[L,*in,r] @ B[L,r,*out] -> [L,*in,*out]."""
    return _matmul(adapter["a"], adapter["b"])


def _matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    L, r = a.shape[0], a.shape[-1]
    ins, outs = a.shape[1:-1], b.shape[2:]
    prod = jnp.einsum("lir,lro->lio", a.reshape(L, -1, r), b.reshape(L, r, -1), preferred_element_type=jnp.float32,
                      precision="highest")  # once per step on the weights: true fp32 (not TF32 on a GPU)
    return prod.reshape(L, *ins, *outs)


def apply_lora(params: dict, adapters: dict, scale: float, *, dropout: float = 0.0, rng: jax.Array | None = None) -> dict:
    """Params with W + scale·A@B on every adapted projection (a new dict; `params` is untouched)."""
    layers = dict(params["layers"])
    keys = jax.random.split(rng, len(adapters)) if (dropout > 0 and rng is not None) else [None] * len(adapters)
    for k, (name, ad) in zip(keys, adapters.items()):
        if name not in layers:
            raise KeyError(f"LoRA adapter for {name!r} but the params have no layers/{name}")
        a = ad["a"]
        if k is not None:
            keep = jax.random.bernoulli(k, 1.0 - dropout, a.shape[:-1] + (1,))
            a = jnp.where(keep, a / (1.0 - dropout), 0.0).astype(a.dtype)
        w = layers[name]
        layers[name] = (w.astype(jnp.float32) + scale * _matmul(a, ad["b"])).astype(w.dtype)
    return {**params, "layers": layers}


def merge(params: dict, adapters: dict, scale: float) -> dict:
    """Base + adapters folded into plain params (no dropout)."""
    return apply_lora(params, adapters, scale)


def export_merged_hf(cfg: ModelConfig, params: dict, adapters: dict, scale: float, path: str) -> None:
    """Merge and write a Hugging Face checkpoint directory (config.json + safetensors) via jaxrag.models.save_hf."""
    save_hf(cfg, jax.device_get(merge(params, adapters, scale)), path)
