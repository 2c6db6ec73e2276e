"""Loss functions over (trainable, frozen, batch) and the jitted train step (accumulation, clipping, metrics).

trainable: {"model": params} (full fine-tune) or {"lora": adapters}, plus {"head": critic/value head} for bt/ppo.
frozen:    {"base": params} with LoRA (the reference = base, adapters off), {"ref": params} for a full fine-tune
           whose loss needs an online reference, else {}.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from jaxrag import losses
from jaxrag.models import critic_scores, forward
from jaxrag.models.lora import apply_lora


def policy_params(trainable, frozen, tc, rng):
    if "lora" in trainable:
        scale = tc.lora.alpha / tc.lora.rank
        return apply_lora(frozen["base"], trainable["lora"], scale, dropout=tc.lora.dropout, rng=rng)
    return trainable["model"]


def reference_params(trainable, frozen):
    ref = frozen.get("base", frozen.get("ref"))
    if ref is None:
        raise ValueError("this loss needs reference log-probs: put them in the batch or pass reference params")
    return jax.lax.stop_gradient(ref)


def sampled_logprobs(logits, tokens, temperature: float):
    """Token log-probs under the sampling distribution log_softmax(logits / T) (what jaxrag.generate records)."""
    return losses.token_logprobs(logits if temperature == 1.0 else logits / temperature, tokens)


def token_values(hidden, head):
    """Value head per token, aligned with token_logprobs: entry t = V(tokens[<t]) read from the hidden state at
    t-1 (the state in which token t was chosen); entry 0 = 0. hidden [B,T,D] -> [B,T] float32."""
    v = hidden.astype(jnp.float32) @ head["w"].astype(jnp.float32) + head["b"].astype(jnp.float32)
    return jnp.pad(v[:, :-1], ((0, 0), (1, 0)))


def make_score_fn(mcfg, tc) -> Callable:
    """(trainable, frozen, batch) -> (logp[B,T] at train.sampling_temperature, values[B,T] or None): the policy's
    own log-probs and (ppo) value estimates of a batch, computed exactly as the grpo/ppo losses compute them."""

    def score(trainable, frozen, batch):
        tok, pos, seg = (batch[k] for k in ("tokens", "positions", "segment_ids"))
        p = policy_params(trainable, frozen, tc, None)
        logits, hidden = forward(mcfg, p, tok, pos, seg, return_hidden=True)
        values = token_values(hidden, trainable["head"]) if "head" in trainable else None
        return sampled_logprobs(logits, tok, tc.sampling_temperature), values

    return score


def _flat(batch, keys=("tokens", "positions", "segment_ids", "loss_mask")):
    """[B,2,T] pair layout -> [2B,T] (row 2i chosen, 2i+1 rejected)."""
    return [batch[k].reshape(-1, batch[k].shape[-1]) for k in keys]


def make_loss_fn(mcfg, tc) -> Callable:
    remat = bool(tc.remat)
    fwd = lambda p, tok, pos, seg: forward(mcfg, p, tok, pos, seg, remat=remat)

    def sft(trainable, frozen, batch, rng):
        p = policy_params(trainable, frozen, tc, rng)
        logp = losses.token_logprobs(fwd(p, batch["tokens"], batch["positions"], batch["segment_ids"]), batch["tokens"])
        return losses.sft_loss(logp, batch["loss_mask"], tc.sft.reduction)

    def dpo(trainable, frozen, batch, rng):
        tok, pos, seg, mask = _flat(batch)
        p = policy_params(trainable, frozen, tc, rng)
        seq = losses.sequence_logprobs(fwd(p, tok, pos, seg), tok, mask).reshape(-1, 2)
        if "ref_logps" in batch:
            ref = batch["ref_logps"]
        else:
            ref = losses.sequence_logprobs(fwd(reference_params(trainable, frozen), tok, pos, seg), tok, mask).reshape(-1, 2)
        return losses.dpo_loss(seq[:, 0], seq[:, 1], ref[:, 0], ref[:, 1], tc.dpo.beta, tc.dpo.label_smoothing, tc.dpo.loss_type)

    def bt(trainable, frozen, batch, rng):
        tok, pos, seg = _flat(batch, ("tokens", "positions", "segment_ids"))
        p = policy_params(trainable, frozen, tc, rng)
        scores = critic_scores(mcfg, p, trainable["head"], tok, pos, seg, batch["read_index"].reshape(-1), remat=remat)
        scores = scores.reshape(-1, 2)
        return losses.bradley_terry_loss(scores[:, 0], scores[:, 1], tc.bt.center_coef)

    temp = float(tc.sampling_temperature)

    def ratio_max_dev(logp, old, mask):  # max |π/π_old - 1| over action tokens: 0 on the first inner step
        return jnp.max(jnp.abs(jnp.exp(jax.lax.stop_gradient(logp) - old) - 1.0) * mask)

    def grpo(trainable, frozen, batch, rng):
        tok, pos, seg, mask = (batch[k] for k in ("tokens", "positions", "segment_ids", "loss_mask"))
        p = policy_params(trainable, frozen, tc, rng)
        logp = sampled_logprobs(fwd(p, tok, pos, seg), tok, temp)
        old = batch["old_logp"] if "old_logp" in batch else jax.lax.stop_gradient(logp)
        if "ref_logp" in batch:
            ref = batch["ref_logp"]
        elif tc.grpo.beta == 0:
            ref = jax.lax.stop_gradient(logp)
        else:
            ref = sampled_logprobs(fwd(reference_params(trainable, frozen), tok, pos, seg), tok, temp)
        clamp = tc.grpo.kl_clamp if tc.grpo.kl_clamp > 0 else None
        loss, m = losses.grpo_loss(logp, old, ref, mask, batch["advantages"], tc.grpo.clip_eps, tc.grpo.beta,
                                   tc.grpo.kl_estimator, tc.grpo.aggregation, clamp, batch.get("token_weight"))
        m["ratio_max_dev"] = ratio_max_dev(logp, old, mask)
        return loss, m

    def ppo(trainable, frozen, batch, rng):
        tok, pos, seg, mask = (batch[k] for k in ("tokens", "positions", "segment_ids", "loss_mask"))
        p = policy_params(trainable, frozen, tc, rng)
        logits, hidden = forward(mcfg, p, tok, pos, seg, return_hidden=True, remat=remat)
        values = token_values(hidden, trainable["head"])
        logp = sampled_logprobs(logits, tok, temp)
        # batches with token_weight come from jaxrag.rl, which whitens advantages over the whole batch itself
        whiten = tc.ppo.whiten and "token_weight" not in batch
        loss, m = losses.ppo_loss(logp, batch["old_logp"], mask, batch["advantages"], values, batch["old_values"],
                                  batch["returns"], tc.ppo.clip_eps, tc.ppo.value_clip_eps, tc.ppo.vf_coef, whiten,
                                  batch.get("token_weight"))
        for name in losses.KL_ESTIMATORS:  # drift from the behaviour policy, every estimator
            m[f"kl/{name}"] = losses._masked_mean(jax.lax.stop_gradient(losses.kl_penalty(logp, batch["old_logp"], name)), mask)
        m["ratio_max_dev"] = ratio_max_dev(logp, batch["old_logp"], mask)
        return loss, m

    return {"sft": sft, "dpo": dpo, "bt": bt, "grpo": grpo, "ppo": ppo}[tc.loss]


def make_prepare(tc) -> Callable:
    """Whole-batch quantities computed before microbatching: GRPO advantages, PPO GAE. -> (batch, metrics).
    A batch that brings its own "advantages" (the RL loop, jaxrag.rl.rows: multi-step episodes) keeps them.
    "token_weight" (aggregation weights normalized over the whole batch) is scaled by grad_accum, since the step
    averages the microbatch gradients: the accumulated gradient then equals the full-batch gradient exactly."""
    accum = int(tc.grad_accum)

    def prepare(batch):
        m = {}
        if tc.loss == "grpo" and "advantages" not in batch:
            r = batch["rewards"]
            batch = {**batch, "advantages": losses.group_advantages(r, tc.grpo.group_size, tc.grpo.adv_eps, tc.grpo.std_ddof)}
            m = {"reward/mean": jnp.mean(r), "reward/std": jnp.std(r)}
        elif tc.loss == "ppo" and "advantages" not in batch:
            adv, ret = losses.gae(batch["rewards"], batch["old_values"], batch["loss_mask"], tc.ppo.gamma, tc.ppo.lam)
            batch = {**batch, "advantages": adv, "returns": ret}
            per_seq = jnp.sum(batch["rewards"], axis=-1)
            m = {"reward/mean": jnp.mean(per_seq), "reward/std": jnp.std(per_seq)}
        if "token_weight" in batch and accum > 1:
            batch = {**batch, "token_weight": batch["token_weight"] * accum}
        return batch, m

    return prepare


def layer_max_abs(grads) -> jax.Array:
    """Max |g| per layer [L] over every stacked-layer leaf (under "layers" or LoRA adapters)."""
    per = []
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        keys = {getattr(k, "key", None) for k in path}
        if ("layers" in keys or "lora" in keys) and g.ndim >= 2:
            per.append(jnp.max(jnp.abs(g.astype(jnp.float32)).reshape(g.shape[0], -1), axis=1))
    return jnp.max(jnp.stack(per), axis=0) if per else jnp.zeros((1,), jnp.float32)


def make_optimizer(tc) -> tuple[optax.GradientTransformation, Callable]:
    o = tc.optimizer
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0 if o.warmup_steps > 0 else o.lr, peak_value=o.lr, warmup_steps=o.warmup_steps,
        decay_steps=max(tc.steps, o.warmup_steps + 1), end_value=o.lr * o.min_lr_ratio)
    decay_mask = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)
    parts = [optax.clip_by_global_norm(o.clip_norm)] if o.clip_norm > 0 else []
    parts.append(optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, mask=decay_mask))
    return optax.chain(*parts), schedule


def make_grad_fn(mcfg, tc) -> Callable:
    """grads(trainable, frozen, batch, rng) -> (grads, metrics): whole-batch prepare, then the loss gradient, averaged
    over grad_accum microbatches (the train step's gradient, before the optimizer)."""
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

    return grads_of


def make_train_step(mcfg, tc, tx, schedule) -> Callable:
    """step(state, frozen, batch) -> (state, metrics). state = {step, trainable, opt_state, rng}."""
    grads_of = make_grad_fn(mcfg, tc)

    def step(state, frozen, batch):
        rng = jax.random.fold_in(state["rng"], state["step"])
        trainable = state["trainable"]
        grads, metrics = grads_of(trainable, frozen, batch, rng)
        metrics["grad_norm"] = optax.tree.norm(grads)
        metrics["grad_layer_max_abs"] = layer_max_abs(grads)
        metrics["lr"] = schedule(state["step"])
        updates, opt_state = tx.update(grads, state["opt_state"], trainable)
        new_state = {"step": state["step"] + 1, "trainable": optax.apply_updates(trainable, updates),
                     "opt_state": opt_state, "rng": state["rng"]}
        return new_state, metrics

    return step
