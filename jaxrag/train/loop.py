"""fit(): the training loop over batches, for every loss, from one CPU to a pod slice (a driver of
jaxrag.train.learner.Learner, which owns the step, resume, checkpoints, the non-finite stop and metrics).

    result = fit(model_cfg, params, batches, loss="sft", train_config={"steps": 100, ...}, workdir="runs/x/sft")

- `batches`: host numpy batches in the layouts of jaxrag.train.batching (the same global batch on every process).
  A `BatchStream` (or anything with `seek(position)`) resumes exactly; a plain re-iterable is replayed from the
  start and the consumed batches are skipped. One batch = one optimizer step (accumulation splits it).
- `workdir`: checkpoints/ (orbax, keep-N, async), metrics.jsonl, tb/ (TensorBoard); None = no files.
- Resume: if workdir/checkpoints has a checkpoint, params, optimizer, step, data position and PRNG are restored
  (from the latest step, or from train.checkpoint.restore_step, which moves the later steps aside).
- A non-finite loss stops the run with NonFiniteLoss naming the step; the last good checkpoint is kept.
- `evaluate(params, step) -> {split: {metric: value}}` runs before the first step, every `eval_every` steps and after
  the last one (steps, never seconds: results do not depend on the machine); its rows go to metrics.jsonl as
  {"kind": "eval", "split", "step", ...} and to TensorBoard under eval/<split>/.
- A checkpoint is resumed only under the settings it was trained with (train_config.json): a rerun whose settings
  differ in anything but learner.RESUMABLE keys (more steps, logging, checkpoint cadence) raises ConfigChanged
  naming them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any, Callable, Iterable

import ml_collections

from jaxrag.train import config as tconfig
from jaxrag.train.batching import batch_tokens
from jaxrag.train.learner import Learner


@dataclasses.dataclass
class FitResult:
    """What fit() returns: the trained params, LoRA adapters, critic/value head, last step and its metrics."""

    params: Any  # the trained policy params (LoRA merged into the base)
    adapters: Any  # LoRA adapters or None
    head: Any  # critic/value head or None
    step: int
    metrics: dict  # the last step's metrics


def _batches_from(batches: Iterable, position: int):
    if hasattr(batches, "seek"):
        batches.seek(position)
        return iter(batches)
    return itertools.islice(iter(batches), position, None)


def fit(
    model_cfg,
    params,
    batches: Iterable[dict],
    loss: str | None = None,
    train_config: dict | ml_collections.ConfigDict | None = None,
    workdir: str | Path | None = None,
    *,
    head=None,
    ref_params=None,
    mesh=None,
    resume: bool = True,
    evaluate: Callable[[Any, int], dict] | None = None,
    eval_every: int = 0,
) -> FitResult:
    """Train on `batches` for train.steps steps (the module doc) -> FitResult.

    Args:
      model_cfg: the ModelConfig of the policy.
      params: the initial policy params pytree.
      batches: host numpy batch dicts (jaxrag.train.batching layouts), one per optimizer step; a BatchStream (or
        anything with `seek(position)`) resumes exactly.
      loss: the objective's name (e.g. "sft", "dpo", "grpo"), overriding train_config's `loss`.
      train_config: the trainer's config (dict or ConfigDict), resolved over the defaults.
      workdir: the run directory (checkpoints/, metrics.jsonl, tb/); None = no files, no resume.
      head: optional critic/value head params.
      ref_params: optional frozen reference params (DPO, KL penalties); None = the initial `params`.
      mesh: optional device mesh; None = built from train_config's `mesh`.
      resume: resume from workdir's latest checkpoint if there is one.
      evaluate: optional `(params, step) -> {split: {metric: value}}`, run at step 0, every `eval_every` steps
        and after the last one.
      eval_every: steps between evaluations; 0 = only before the first and after the last step.

    Returns:
      FitResult with the trained params, adapters, head, the last step done and its metrics.

    Raises:
      ValueError: if the train config is invalid, or ConfigChanged if a checkpoint's settings differ.
      NonFiniteLoss: if a step's loss is not finite.
    """
    tc = tconfig.resolve(train_config)
    if loss is not None:
        with tc.unlocked():
            tc.loss = loss
        tconfig.validate(tc)
    lr = Learner(model_cfg, params, tc, head=head, ref_params=ref_params, mesh=mesh)
    start = lr.open(workdir, tc.steps, resume=resume)
    it = _batches_from(batches, start)
    last: dict = {}
    step = start

    def run_eval(at: int) -> None:
        if evaluate is not None:
            for split, m in evaluate(lr.params, at).items():
                lr.write_eval(at, split, m)

    try:
        if start == 0:
            run_eval(0)
        lr.arm()
        for step in range(start + 1, tc.steps + 1):
            try:
                host = next(it)
            except StopIteration:
                print(f"[fit] the batch iterator ended after {step - 1} steps (train.steps={tc.steps})")
                step -= 1
                break
            last = lr.update(host)
            lr.check_finite([last["loss"]], f"step {step}")
            if step % tc.log_every == 0 or step == tc.steps:
                lr.write(step, last, batch_tokens(host))
            if eval_every and step % eval_every == 0 and step != tc.steps:
                run_eval(step)
            lr.end_step(step, tc.steps, {"loss": last["loss"]})
        else:
            step = tc.steps
        if step > start:
            run_eval(step)
        lr.finish(step, {"loss": last.get("loss")})
    finally:
        lr.close()
    return FitResult(params=lr.params, adapters=lr.adapters, head=lr.head, step=step, metrics=last)


def save_summary(path: str | Path, result: FitResult) -> None:
    Path(path).write_text(json.dumps({"step": result.step, "metrics": result.metrics}, indent=2))
