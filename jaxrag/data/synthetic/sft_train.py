"""Time-budgeted SFT over jaxrag.train's jitted step, with periodic teacher-forced evaluation.

Uses `jaxrag.train.loop.build` (optimizer, loss "sft", clipping) and drives its step function itself, because the
demo trains for a wall-clock budget and records held-out teacher-forced accuracy along the way (training curves).
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from jaxrag import sharding as shd
from jaxrag.models import forward
from jaxrag.train import config as tconfig
from jaxrag.train.batching import pick_bucket
from jaxrag.train.loop import build
from jaxrag.train.state import init_state, put


def batch_from(arrays: dict, rows: np.ndarray, buckets) -> dict:
    """Rows of the [N, T] arrays, trimmed to the smallest bucket holding the longest row (with positions)."""
    seg = arrays["segment_ids"][rows]
    t = pick_bucket(int((seg > 0).sum(1).max()), buckets, "SFT batch")
    out = {k: arrays[k][rows, :t] for k in ("tokens", "loss_mask", "segment_ids")}
    if "positions" in arrays:  # packed rows: positions restart in every segment
        out["positions"] = arrays["positions"][rows, :t]
    else:
        out["positions"] = np.broadcast_to(np.arange(t, dtype=np.int32), out["tokens"].shape).copy()
    return out


def make_eval_fn(mcfg):
    @jax.jit
    def stats(params, tokens, loss_mask, segment_ids):
        """Per sequence: all action tokens argmax-right (teacher forced), action-token accuracy, NLL."""
        logits = forward(mcfg, params, tokens, None, segment_ids)
        pred = jnp.argmax(logits[:, :-1], -1)
        mask = loss_mask[:, 1:] > 0
        right = (pred == tokens[:, 1:]) | ~mask
        logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), -1)
        nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
        return (jnp.all(right, -1), jnp.sum((pred == tokens[:, 1:]) & mask), jnp.sum(mask), jnp.sum(nll * mask))

    return stats


def teacher_forced(eval_fn, params, arrays: dict, buckets, batch: int = 64) -> dict:
    n = len(arrays["tokens"])
    if n == 0:
        return {"all_actions_right": 0.0, "action_token_acc": 0.0, "nll": 0.0}
    all_right, correct, total, nll = [], 0, 0, 0.0
    for s in range(0, n, batch):
        rows = np.arange(s, min(n, s + batch))
        b = batch_from(arrays, rows, buckets)
        a, c, t, l = eval_fn(params, b["tokens"], b["loss_mask"], b["segment_ids"])
        all_right.append(np.asarray(a))
        correct, total, nll = correct + int(c), total + int(t), nll + float(l)
    return {
        "all_actions_right": float(np.concatenate(all_right).mean()),
        "action_token_acc": correct / max(total, 1),
        "nll": nll / max(total, 1),
    }


def train_sft(
    mcfg,
    params,
    train: dict,
    evals: dict[str, dict],
    *,
    lr: float,
    batch_size: int,
    time_budget_s: float,
    max_steps: int,
    warmup_steps: int = 50,
    buckets=(64, 128, 192, 256),
    eval_every_s: float = 30.0,
    seed: int = 0,
    metrics_path: str | None = None,
    progress: bool = True,
):
    """Train until `time_budget_s` or `max_steps`; returns (params, history list of metric dicts)."""
    tc = tconfig.resolve(
        {
            "loss": "sft",
            "steps": int(max_steps),
            "batch_size": int(batch_size),
            "seed": seed,
            "seq_buckets": tuple(buckets),
            "progress": False,
            "optimizer": {"lr": lr, "warmup_steps": warmup_steps, "min_lr_ratio": 0.1, "weight_decay": 0.01},
        }
    )
    tr = build(mcfg, params, tc)
    state = init_state(put(tr.trainable, tr.state_sh["trainable"]), tr.tx, tc.seed, tr.state_sh)
    frozen = put(tr.frozen, tr.frozen_sh)
    eval_fn = make_eval_fn(tr.mcfg)
    rng = np.random.default_rng(seed)
    n = len(train["tokens"])
    history, log = [], open(metrics_path, "w") if metrics_path else None
    train_time, last_eval, tokens_seen, step = 0.0, -1e9, 0, 0
    bar = tqdm(total=int(max_steps), unit="step", desc="sft", disable=not progress, mininterval=2.0)

    def record(kind, metrics):
        row = {"kind": kind, "step": step, "time_s": round(train_time, 2), "tokens": tokens_seen, **metrics}
        history.append(row)
        if log:
            log.write(json.dumps(row) + "\n")
            log.flush()

    while step < max_steps and train_time < time_budget_s:
        if train_time - last_eval >= eval_every_s:
            params_now = state["trainable"]["model"]
            for name, arrays in evals.items():
                record("eval", {"split": name, **teacher_forced(eval_fn, params_now, arrays, buckets)})
            last_eval = train_time
        t0 = time.perf_counter()
        host = batch_from(train, rng.integers(0, n, batch_size), buckets)
        state, metrics = tr.step_fn(state, frozen, shd.shard_batch(tr.mesh, host))
        loss = float(metrics["loss"])  # blocks: the step's time is real time
        dt = time.perf_counter() - t0
        train_time += dt
        step += 1
        tokens_seen += int(host["segment_ids"].sum())
        if not np.isfinite(loss):
            raise FloatingPointError(f"SFT loss is {loss} at step {step}")
        if step % 10 == 0:
            record("train", {"loss": loss, "tokens_per_s": tokens_seen / max(train_time, 1e-9)})
        bar.set_postfix(loss=f"{loss:.3f}", train_s=f"{train_time:.0f}/{time_budget_s:.0f}", refresh=False)
        bar.update(1)
    params_out = state["trainable"]["model"]
    for name, arrays in evals.items():
        record("eval", {"split": name, **teacher_forced(eval_fn, params_out, arrays, buckets)})
    bar.close()
    if log:
        log.close()
    return jax.device_get(params_out), history
