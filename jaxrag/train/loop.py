"""fit(): the one training loop for every loss, from one CPU to a pod slice.

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
  differ in anything but RESUMABLE keys (more steps, logging, checkpoint cadence) raises ConfigChanged naming them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path
from typing import Any, Callable, Iterable

import jax
import ml_collections

from jaxrag import settings
from jaxrag import sharding as shd
from jaxrag.models.lora import merge
from jaxrag.train import config as tconfig
from jaxrag.train.batching import batch_tokens
from jaxrag.train import preemption
from jaxrag.train.checkpoint import Checkpointer
from jaxrag.train.distributed import barrier
from jaxrag.train.metrics_log import MetricsWriter, flatten_metrics
from jaxrag.train.state import abstract_state, init_state, put, split_params, state_shardings
from jaxrag.settings import NEUTRAL
from jaxrag.train.steps import make_optimizer, make_train_step


class NonFiniteLoss(FloatingPointError):
    pass


class ConfigChanged(ValueError):
    pass


# Keys that may differ between a checkpoint's run and its resumption: more steps, and the result-neutral ones.
RESUMABLE = ("steps",) + NEUTRAL


def changed_keys(old: dict, new: dict, ignore=RESUMABLE) -> list[str]:
    """Dotted keys whose values differ between two train configs (as dicts), `ignore`d keys left out."""
    return settings.changed_keys(old, new, ignore)


@dataclasses.dataclass
class FitResult:
    params: Any  # the trained policy params (LoRA merged into the base)
    adapters: Any  # LoRA adapters or None
    head: Any  # critic/value head or None
    step: int
    metrics: dict  # the last step's metrics


@dataclasses.dataclass
class Trainer:
    """Everything fit() builds before the first step (also used by the benchmarks and the memory plan)."""
    mcfg: Any
    tc: ml_collections.ConfigDict
    mesh: Any
    tx: Any
    schedule: Any
    trainable: Any
    frozen: Any
    state_sh: dict
    frozen_sh: Any
    step_fn: Any  # jitted (state, frozen, batch) -> (state, metrics), state donated


def build(model_cfg, params, tc, *, head=None, ref_params=None, mesh=None) -> Trainer:
    mcfg = model_cfg.replace(dtype=tc.compute_dtype)
    mesh = shd.make_mesh(tuple(tc.mesh)) if mesh is None else mesh
    tx, schedule = make_optimizer(tc)
    trainable, frozen, t_axes, f_axes = split_params(mcfg, tc, params, head, ref_params)
    t_abs, f_abs = shd.abstract(trainable), shd.abstract(frozen)
    trainable_sh = shd.param_shardings(mesh, t_abs, t_axes)
    frozen_sh = shd.param_shardings(mesh, f_abs, f_axes)
    state_sh = state_shardings(mesh, tx, t_abs, trainable_sh)
    step_fn = jax.jit(make_train_step(mcfg, tc, tx, schedule, mesh), out_shardings=(state_sh, shd.replicated(mesh)),
                      donate_argnums=(0,))
    return Trainer(mcfg, tc, mesh, tx, schedule, trainable, frozen, state_sh, frozen_sh, step_fn)


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
    tc = tconfig.resolve(train_config)
    if loss is not None:
        with tc.unlocked():
            tc.loss = loss
        tconfig.validate(tc)
    tr = build(model_cfg, params, tc, head=head, ref_params=ref_params, mesh=mesh)
    state = init_state(put(tr.trainable, tr.state_sh["trainable"]), tr.tx, tc.seed, tr.state_sh)
    frozen = put(tr.frozen, tr.frozen_sh)

    ckpt = None
    start = 0
    if workdir is not None:
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        if tc.checkpoint.enabled:
            ckpt = Checkpointer(workdir / "checkpoints", keep=tc.checkpoint.keep, async_save=tc.checkpoint.async_save)
        if ckpt is not None and resume and ckpt.latest_step() is not None:
            saved = workdir / "train_config.json"
            if saved.exists():
                diff = changed_keys(json.loads(saved.read_text()), tc.to_dict())
                if diff:
                    ckpt.close()
                    raise ConfigChanged(f"{workdir}/checkpoints was trained with other settings ({', '.join(diff)} "
                                        f"differ; see {saved}); remove the checkpoints to start over")
            target = abstract_state(tr.tx, shd.abstract(tr.trainable), tr.state_sh, tc.seed)
            restore_step = int(tc.checkpoint.restore_step) or None
            if restore_step is not None:
                if restore_step not in ckpt.all_steps():
                    ckpt.close()
                    raise FileNotFoundError(f"train.checkpoint.restore_step={restore_step}: no such checkpoint under "
                                            f"{ckpt.directory} (saved steps: {ckpt.all_steps()})")
                if jax.process_index() == 0:
                    moved = ckpt.set_aside_after(restore_step)
                    if moved:
                        print(f"[fit] resuming from step {restore_step}; later steps moved aside: "
                              f"{', '.join(p.name for p in moved)}")
                if jax.process_count() > 1:  # the others see the steps process 0 moved aside
                    barrier(f"fit:set_aside:{ckpt.directory}")
                    ckpt.manager.reload()
            state, meta = ckpt.restore(target, restore_step)
            start = int(meta["data_position"])
        if jax.process_index() == 0:
            tmp = workdir / "train_config.json.tmp"
            tmp.write_text(tc.to_json(indent=2))
            tmp.replace(workdir / "train_config.json")

    writer = MetricsWriter(workdir, tc.steps, start, progress=tc.progress)
    it = _batches_from(batches, start)
    last: dict = {}
    step = start

    def run_eval(at: int) -> None:
        if evaluate is not None:
            for split, m in evaluate(_policy_params(state, frozen, tc), at).items():
                writer.write_eval(at, split, m)

    if start == 0:
        run_eval(0)
    preemption.arm()
    try:
        for step in range(start + 1, tc.steps + 1):
            try:
                host = next(it)
            except StopIteration:
                print(f"[fit] the batch iterator ended after {step - 1} steps (train.steps={tc.steps})")
                step -= 1
                break
            state, metrics = tr.step_fn(state, frozen, shd.shard_batch(tr.mesh, host))
            last = flatten_metrics(metrics)
            if not math.isfinite(last["loss"]):
                where = ckpt.latest_step() if ckpt is not None else None
                raise NonFiniteLoss(f"loss is {last['loss']} at step {step}; stopped; last good checkpoint: "
                                    f"{'none' if where is None else ckpt.directory / str(where)}")
            if step % tc.log_every == 0 or step == tc.steps:
                writer.write(step, last, batch_tokens(host))
            if eval_every and step % eval_every == 0 and step != tc.steps:
                run_eval(step)
            if ckpt is not None and (step % tc.checkpoint.every_steps == 0 or step == tc.steps):
                ckpt.save(step, state, {"step": step, "data_position": step, "loss": last["loss"]})
            if step < tc.steps and preemption.requested():
                preemption.stop(ckpt, step, state, {"step": step, "data_position": step, "loss": last["loss"]})
        else:
            step = tc.steps
        if step > start:
            run_eval(step)
        if ckpt is not None and step > start and ckpt.latest_step() != step:
            ckpt.save(step, state, {"step": step, "data_position": step, "loss": last.get("loss")})
    finally:
        preemption.disarm()
        if ckpt is not None:
            ckpt.close()
        writer.close()

    trained = state["trainable"]
    return FitResult(params=_policy_params(state, frozen, tc), adapters=trained.get("lora"), head=trained.get("head"),
                     step=step, metrics=last)


def _policy_params(state, frozen, tc):
    """The policy's params now: the trained model, or the base with the LoRA adapters merged in."""
    trained = state["trainable"]
    if trained.get("lora") is not None:
        return merge(frozen["base"], trained["lora"], tc.lora.alpha / tc.lora.rank)
    return trained["model"]


def save_summary(path: str | Path, result: FitResult) -> None:
    Path(path).write_text(json.dumps({"step": result.step, "metrics": result.metrics}, indent=2))
