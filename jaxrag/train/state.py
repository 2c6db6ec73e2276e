"""Train state {step, trainable, opt_state, rng}, what is frozen, and where every leaf lives on the mesh."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrag import sharding as shd
from jaxrag.models import critic_init, param_logical_axes
from jaxrag.models.lora import init_lora, lora_logical_axes
from jaxrag.train.objectives import objective


def split_params(mcfg, tc, params, head=None, ref_params=None, key=None) -> tuple[dict, dict, dict, dict]:
    """-> (trainable, frozen, trainable_logical_axes, frozen_logical_axes), all host/any-device arrays."""
    key = jax.random.PRNGKey(tc.seed) if key is None else key
    k_lora, k_head = jax.random.split(key)
    axes = param_logical_axes(mcfg)
    trainable, t_axes, frozen, f_axes = {}, {}, {}, {}
    if tc.lora.enabled:
        adapters = init_lora(mcfg, k_lora, tuple(tc.lora.targets), tc.lora.rank)
        trainable["lora"], t_axes["lora"] = adapters, lora_logical_axes(mcfg, adapters)
        frozen["base"], f_axes["base"] = params, axes
    else:
        trainable["model"], t_axes["model"] = params, axes
        if objective(tc).needs_ref(tc):
            # a copy: the trainable buffers are donated to the step, the reference must outlive them
            ref = params if ref_params is None else ref_params
            frozen["ref"], f_axes["ref"] = jax.tree.map(np.array, jax.device_get(ref)), axes
    if objective(tc).needs_head:
        trainable["head"] = critic_init(mcfg, k_head) if head is None else head
        t_axes["head"] = {"w": ("embed",), "b": ()}
    return trainable, frozen, t_axes, f_axes


def put(tree: Any, shardings: Any) -> Any:
    """Place host or device arrays onto (possibly multi-process) shardings; every process holds the same values."""
    def one(x, s):
        x = np.asarray(jax.device_get(x))
        return jax.make_array_from_callback(x.shape, s, lambda idx: x[idx])
    return jax.tree.map(one, tree, shardings)


def state_shardings(mesh, tx, trainable_abstract, trainable_sh) -> dict:
    opt_abstract = jax.eval_shape(tx.init, trainable_abstract)
    rep = shd.replicated(mesh)
    return {
        "step": rep,
        "trainable": trainable_sh,
        "opt_state": shd.like_params_shardings(mesh, opt_abstract, trainable_sh, trainable_abstract),
        "rng": rep,
    }


def init_state(trainable, tx, seed: int, shardings: dict) -> dict:
    """Sharded state; the optimizer state is created on device already in its final layout."""
    def make(tr):
        return {"step": jnp.zeros((), jnp.int32), "trainable": tr, "opt_state": tx.init(tr),
                "rng": jax.random.PRNGKey(seed)}
    return jax.jit(make, out_shardings=shardings)(trainable)


def abstract_state(tx, trainable_abstract, shardings: dict, seed: int = 0) -> dict:
    """ShapeDtypeStructs of the state with their shardings (orbax restore target, AOT lowering)."""
    def make(tr):
        return {"step": jnp.zeros((), jnp.int32), "trainable": tr, "opt_state": tx.init(tr),
                "rng": jax.random.PRNGKey(seed)}
    shapes = jax.eval_shape(make, trainable_abstract)
    return shd.abstract(shapes, shardings)
