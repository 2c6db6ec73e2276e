"""Step metrics -> JSONL + TensorBoard event files + a tqdm bar (tokens/s, ETA). Only process 0 writes."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

from jaxrag.jsonl import iter_jsonl


def flatten_metrics(metrics: dict) -> dict[str, float]:
    """Device metrics -> plain floats; vector metrics (per-layer max |grad|) become one key per entry."""
    out = {}
    for k, v in jax.device_get(metrics).items():
        v = np.asarray(v)
        if v.ndim == 0:
            out[k] = float(v)
        elif k == "grad_layer_max_abs":
            out.update({f"grad_max_abs/layer_{i:02d}": float(x) for i, x in enumerate(v)})
        else:
            out.update({f"{k}/{i}": float(x) for i, x in enumerate(v.ravel())})
    return out


def postfix(metrics: dict, tokens_per_s: float) -> dict:
    """The bar's numbers: an RL step's mean reward (its loss hovers near 0 whatever the policy learns), else the
    loss; then tokens/s."""
    if "reward/mean" in metrics:
        shown = {"reward": f"{metrics['reward/mean']:.4g}"}
    else:
        shown = {"loss": f"{metrics.get('loss', float('nan')):.4g}"}
    return {**shown, "tok_s": f"{tokens_per_s:.0f}"}


class MetricsWriter:
    def __init__(self, workdir: str | Path | None, total_steps: int, start_step: int = 0, progress: bool = True):
        self.enabled = jax.process_index() == 0
        self.jsonl = self.tb = self.bar = None
        self.last_time = time.perf_counter()
        if not self.enabled:
            return
        if workdir is not None:
            workdir = Path(workdir)
            workdir.mkdir(parents=True, exist_ok=True)
            self.jsonl = open(workdir / "metrics.jsonl", "a")
            from tensorboardX import SummaryWriter

            self.tb = SummaryWriter(str(workdir / "tb"))
        if progress:
            self.bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True)

    def write(self, step: int, metrics: dict[str, float], tokens: int) -> None:
        now = time.perf_counter()
        dt, self.last_time = now - self.last_time, now
        if not self.enabled:
            return
        record = {"kind": "train", "step": step, **metrics, "tokens": tokens, "step_time_s": dt,
                  "tokens_per_s": tokens / max(dt, 1e-9)}
        self._record(record, "")
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(postfix(metrics, record["tokens_per_s"]))

    def write_eval(self, step: int, split: str, metrics: dict[str, float]) -> None:
        """A periodic evaluation's metrics: a JSONL row {"kind": "eval", "split", "step", ...}, TensorBoard
        scalars under eval/<split>/."""
        if self.enabled:
            self._record({"kind": "eval", "split": split, "step": step, **metrics}, f"eval/{split}/")

    def _record(self, record: dict, tb_prefix: str) -> None:
        if self.jsonl is not None:
            self.jsonl.write(json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                                         for k, v in record.items()}) + "\n")
            self.jsonl.flush()
        if self.tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(tb_prefix + k, v, record["step"])

    def close(self) -> None:
        for h in (self.jsonl, self.tb, self.bar):
            if h is not None:
                h.close()


def read_metrics(path: str | Path) -> dict[int, dict]:
    """metrics.jsonl -> {step: training record}; a step logged twice (a resumed run) keeps its last record.
    Evaluation rows ({"kind": "eval"}) are left out: read them with `read_eval_metrics`."""
    return {r["step"]: r for r in _rows(path) if r.get("kind", "train") == "train"}


def read_eval_metrics(path: str | Path) -> list[dict]:
    """The evaluation rows of metrics.jsonl, in order (a resumed run's repeated steps keep their last row)."""
    last = {(r["split"], r["step"]): r for r in _rows(path) if r.get("kind") == "eval"}
    return sorted(last.values(), key=lambda r: (r["step"], r["split"]))


def _rows(path: str | Path) -> list[dict]:
    return [r for _, r in iter_jsonl(path)]
