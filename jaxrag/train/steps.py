"""The optimizer and the jitted train step (accumulation, clipping, metrics) over the loss table's objectives
(jaxrag/train/objectives.py)."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from jaxrag.train.objectives import make_loss_fn, make_prepare


def layer_max_abs(grads) -> jax.Array:
    """Max |g| per layer [L] over every stacked-layer leaf (under "layers" or LoRA adapters)."""
    per = []
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        keys = {getattr(k, "key", None) for k in path}
        if ("layers" in keys or "lora" in keys) and g.ndim >= 2:
            per.append(jnp.max(jnp.abs(g.astype(jnp.float32)).reshape(g.shape[0], -1), axis=1))
    return jnp.max(jnp.stack(per), axis=0) if per else jnp.zeros((1,), jnp.float32)


def lr_schedule(tc) -> Callable:
    """The learning rate per optimizer step: linear warmup to `lr`, then "cosine" (decay to lr * min_lr_ratio at
    `steps`) or "wsd" (warmup-stable-decay: `lr` held until the last decay_fraction of the steps, which decay to
    lr * min_lr_ratio on a cosine)."""
    o = tc.optimizer
    if o.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0 if o.warmup_steps > 0 else o.lr, peak_value=o.lr, warmup_steps=o.warmup_steps,
            decay_steps=max(tc.steps, o.warmup_steps + 1), end_value=o.lr * o.min_lr_ratio)
    n_decay = max(1, int(round(o.decay_fraction * tc.steps)))
    stable_end = max(o.warmup_steps, tc.steps - n_decay)
    return optax.join_schedules([optax.linear_schedule(0.0, o.lr, o.warmup_steps), optax.constant_schedule(o.lr),
                                 optax.cosine_decay_schedule(o.lr, n_decay, alpha=o.min_lr_ratio)],
                                [o.warmup_steps, stable_end])


def make_optimizer(tc) -> tuple[optax.GradientTransformation, Callable]:
    o = tc.optimizer
    schedule = lr_schedule(tc)
    decay_mask = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)
    parts = [optax.clip_by_global_norm(o.clip_norm)] if o.clip_norm > 0 else []
    parts.append(optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, mask=decay_mask))
    return optax.chain(*parts), schedule


def under_mesh(fn: Callable, mesh) -> Callable:
    """fn traced with `mesh` in context (as an abstract mesh), so the model pins its activations to rows over the
    batch axes (jaxrag.models.transformer.constrain_rows): FSDP moves the weights, not every token's activations.
    mesh None or one device: fn unchanged (the same program as before)."""
    if mesh is None or mesh.size == 1:
        return fn

    def traced(*args):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args)

    return traced


def make_grad_fn(mcfg, tc, mesh=None) -> Callable:
    """grads(trainable, frozen, batch, rng) -> (grads, metrics): whole-batch prepare, then the loss gradient, averaged
    over grad_accum microbatches (the train step's gradient, before the optimizer). mesh: the mesh the step's
    arrays live on (activations kept split over its batch axes: `under_mesh`)."""
    loss_fn = make_loss_fn(mcfg, tc)
    prepare = make_prepare(tc)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    accum = int(tc.grad_accum)

    def grads_of(trainable, frozen, batch, rng):
        batch, extra = prepare(batch)
        if accum == 1:
            (_, metrics), grads = grad_fn(trainable, frozen, batch, rng)
        else:  # microbatch i takes rows i, i+A, i+2A, ...: each device keeps its own rows
            micro = jax.tree.map(lambda x: jnp.swapaxes(x.reshape(x.shape[0] // accum, accum, *x.shape[1:]), 0, 1), batch)

            def body(acc, xs):
                mb, i = xs
                (_, m), g = grad_fn(trainable, frozen, mb, jax.random.fold_in(rng, i))
                return jax.tree.map(jnp.add, acc, g), m

            zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), trainable)
            grads, ms = jax.lax.scan(body, zeros, (micro, jnp.arange(accum)))
            grads = jax.tree.map(lambda g, p: (g / accum).astype(p.dtype), grads, trainable)
            metrics = {k: (jnp.max if k.endswith("_max_dev") else jnp.mean)(v, axis=0) for k, v in ms.items()}
        return grads, {**metrics, **extra}

    return under_mesh(grads_of, mesh)


def make_apply_fn(tx, schedule) -> Callable:
    """apply(state, grads) -> (state, metrics): one optimizer update from a finished gradient (the second half of
    the train step; the RL loop calls it on gradients summed over sequence-length groups)."""

    def apply(state, grads):
        trainable = state["trainable"]
        metrics = {"grad_norm": optax.tree.norm(grads), "grad_layer_max_abs": layer_max_abs(grads),
                   "lr": schedule(state["step"])}
        updates, opt_state = tx.update(grads, state["opt_state"], trainable)
        new_state = {"step": state["step"] + 1, "trainable": optax.apply_updates(trainable, updates),
                     "opt_state": opt_state, "rng": state["rng"]}
        return new_state, metrics

    return apply


def make_train_step(mcfg, tc, tx, schedule, mesh=None) -> Callable:
    """step(state, frozen, batch) -> (state, metrics). state = {step, trainable, opt_state, rng}; mesh: as in
    make_grad_fn."""
    grads_of = make_grad_fn(mcfg, tc, mesh)
    apply = make_apply_fn(tx, schedule)

    def step(state, frozen, batch):
        rng = jax.random.fold_in(state["rng"], state["step"])
        grads, metrics = grads_of(state["trainable"], frozen, batch, rng)
        state, m = apply(state, grads)
        return state, {**metrics, **m}

    return step
