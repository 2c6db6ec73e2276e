"""Teacher-forced evaluation of a policy on SFT arrays (the training curves' held-out numbers).

Per sequence: are all action tokens the argmax (the policy would reproduce the whole trajectory greedily, given
the same observations), plus action-token accuracy and NLL. Arrays are the SFT layout of jaxrag.train.batching
(tokens, loss_mask, segment_ids [, positions] as [N, T] numpy); rows are trimmed to the smallest bucket.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrag.models import forward
from jaxrag.train.batching import pick_bucket


def rows_batch(arrays: dict, rows: np.ndarray, buckets) -> dict:
    """Rows of the [N, T] arrays, trimmed to the smallest bucket holding the longest row (with positions)."""
    seg = arrays["segment_ids"][rows]
    t = pick_bucket(int((seg > 0).sum(1).max()), buckets, "batch")
    out = {k: arrays[k][rows, :t] for k in ("tokens", "loss_mask", "segment_ids")}
    if "positions" in arrays:  # packed rows: positions restart in every segment
        out["positions"] = arrays["positions"][rows, :t]
    else:
        out["positions"] = np.broadcast_to(np.arange(t, dtype=np.int32), out["tokens"].shape).copy()
    return out


def make_eval_fn(mcfg):
    @jax.jit
    def stats(params, tokens, positions, loss_mask, segment_ids):
        logits = forward(mcfg, params, tokens, positions, segment_ids)
        pred = jnp.argmax(logits[:, :-1], -1)
        mask = loss_mask[:, 1:] > 0
        right = (pred == tokens[:, 1:]) | ~mask
        logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), -1)
        nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
        return jnp.all(right, -1), jnp.sum((pred == tokens[:, 1:]) & mask), jnp.sum(mask), jnp.sum(nll * mask)

    return stats


def teacher_forced(eval_fn, params, arrays: dict, buckets, batch: int = 64) -> dict:
    """{"all_actions_right", "action_token_acc", "nll"} over every row of `arrays` (one sequence per row)."""
    n = len(arrays["tokens"])
    if n == 0:
        return {"all_actions_right": 0.0, "action_token_acc": 0.0, "nll": 0.0}
    all_right, correct, total, nll = [], 0, 0, 0.0
    for s in range(0, n, batch):
        b = rows_batch(arrays, np.arange(s, min(n, s + batch)), buckets)
        a, c, t, l = eval_fn(params, b["tokens"], b["positions"], b["loss_mask"], b["segment_ids"])
        all_right.append(np.asarray(a))
        correct, total, nll = correct + int(c), total + int(t), nll + float(l)
    return {
        "all_actions_right": float(np.concatenate(all_right).mean()),
        "action_token_acc": correct / max(total, 1),
        "nll": nll / max(total, 1),
    }
