"""The Learner: what every training driver shares, in one object.

It owns the jitted train step (and, for an update split into sub-batches, the gradient and apply steps), scoring
under the current params, resume (the settings check and train.checkpoint.restore_step), checkpoint cadence, the
stop at a non-finite loss, the metrics writer, preemption, and the current params. The drivers keep only their
loop: `train.loop.fit` iterates over batches; `rl.loop.train_rl` samples, rewards and builds rows, then calls
`update`.

    lr = Learner(model_cfg, params, tc)
    start = lr.open(workdir, total_steps)          # resumes, or 0
    try:
        for step in range(start + 1, total_steps + 1):
            metrics = lr.update(batch)
            lr.check_finite([metrics["loss"]], f"step {step}")
            lr.write(step, metrics, tokens)
            lr.end_step(step, total_steps, {"loss": metrics["loss"]})
    finally:
        lr.close()
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxrag import settings as S
from jaxrag import sharding as shd
from jaxrag.models.lora import merge
from jaxrag.settings import NEUTRAL
from jaxrag.train import preemption
from jaxrag.train.checkpoint import Checkpointer
from jaxrag.train.distributed import barrier
from jaxrag.train.metrics_log import MetricsWriter, flatten_metrics
from jaxrag.train.objectives import make_score_fn
from jaxrag.train.state import abstract_state, init_state, put, split_params, state_shardings
from jaxrag.train.steps import make_apply_fn, make_grad_fn, make_optimizer, make_train_step, under_mesh


class NonFiniteLoss(FloatingPointError):
    pass


class ConfigChanged(ValueError):
    pass


# Keys that may differ between a checkpoint's run and its resumption: more steps, and the result-neutral ones.
RESUMABLE = ("steps",) + NEUTRAL


def changed_keys(old: dict, new: dict, ignore=RESUMABLE) -> list[str]:
    """Dotted keys whose values differ between two train configs (as dicts), `ignore`d keys left out."""
    return S.changed_keys(old, new, ignore)


@dataclasses.dataclass
class Trainer:
    """The compiled pieces of a trainer config (also used by the benchmarks and the memory plan)."""
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


class Learner:
    """One trainer's state and everything around its steps (the module doc)."""

    def __init__(self, model_cfg, params, tc, *, head=None, ref_params=None, mesh=None):
        """tc: a resolved, validated trainer config; head / ref_params: a critic or value head, a frozen
        reference; mesh: the device mesh (default: from tc.mesh)."""
        self.tc = tc
        self.tr = build(model_cfg, params, tc, head=head, ref_params=ref_params, mesh=mesh)
        self.state = init_state(put(self.tr.trainable, self.tr.state_sh["trainable"]), self.tr.tx, tc.seed,
                                self.tr.state_sh)
        self.frozen = put(self.tr.frozen, self.tr.frozen_sh)
        self.ckpt: Checkpointer | None = None
        self.writer: MetricsWriter | None = None
        self.start = 0
        self._score = self._grad = self._apply = None

    @property
    def mcfg(self):
        return self.tr.mcfg

    @property
    def mesh(self):
        return self.tr.mesh

    # ---- the current params
    def policy_params(self) -> tuple[Any, str]:
        """The policy's params now and how they were made: "shared" (the trained arrays themselves, full
        fine-tune) or "lora_merge" (the frozen base with the adapters merged in)."""
        trained = self.state["trainable"]
        if trained.get("lora") is not None:
            return merge(self.frozen["base"], trained["lora"], self.tc.lora.alpha / self.tc.lora.rank), "lora_merge"
        return trained["model"], "shared"

    @property
    def params(self):
        return self.policy_params()[0]

    @property
    def adapters(self):
        return self.state["trainable"].get("lora")

    @property
    def head(self):
        return self.state["trainable"].get("head")

    # ---- files: resume, settings, metrics
    def open(self, workdir: str | Path | None, total_steps: int, *, resume: bool = True, settings: dict | None = None,
             settings_file: str = "train_config.json", ignore: Sequence[str] = RESUMABLE,
             progress: bool | None = None) -> int:
        """Checkpoints under workdir/checkpoints; with one there (and `resume`), the state is restored from the
        latest step, or from train.checkpoint.restore_step (later steps are moved aside), provided `settings`
        (default: the trainer config) equal those saved in `settings_file` up to the `ignore`d keys; else
        ConfigChanged names the keys. Writes train_config.json (and `settings_file`) and opens the metrics writer
        (JSONL + TensorBoard; workdir None: no files, no resume). Returns the data position to continue from."""
        tc = self.tc
        if workdir is not None:
            workdir = Path(workdir)
            workdir.mkdir(parents=True, exist_ok=True)
            settings = tc.to_dict() if settings is None else settings
            if tc.checkpoint.enabled:
                self.ckpt = Checkpointer(workdir / "checkpoints", keep=tc.checkpoint.keep,
                                         async_save=tc.checkpoint.async_save)
            if self.ckpt is not None and resume and self.ckpt.latest_step() is not None:
                self._check_settings(workdir / settings_file, settings, ignore)
                self._restore()
            barrier(f"learner:settings_read:{workdir}")  # every process compared them before process 0 rewrites them
            if jax.process_index() == 0:
                _write_atomic(workdir / "train_config.json", tc.to_json(indent=2))
                if settings_file != "train_config.json":
                    _write_atomic(workdir / settings_file, json.dumps(settings, indent=1))
        self.writer = MetricsWriter(workdir, total_steps, self.start, progress=tc.progress if progress is None
                                    else progress)
        return self.start

    def _check_settings(self, saved: Path, settings: dict, ignore) -> None:
        if not saved.exists():
            return
        diff = changed_keys(json.loads(saved.read_text()), settings, ignore=ignore)
        if diff:
            self.ckpt.close()
            raise ConfigChanged(f"{saved.parent}/checkpoints was trained with other settings ({', '.join(diff)} "
                                f"differ; see {saved}); remove the checkpoints to start over")

    def _restore(self) -> None:
        ckpt, tc = self.ckpt, self.tc
        target = abstract_state(self.tr.tx, shd.abstract(self.tr.trainable), self.tr.state_sh, tc.seed)
        restore_step = int(tc.checkpoint.restore_step) or None
        if restore_step is not None:
            if restore_step not in ckpt.all_steps():
                ckpt.close()
                raise FileNotFoundError(f"train.checkpoint.restore_step={restore_step}: no such checkpoint under "
                                        f"{ckpt.directory} (saved steps: {ckpt.all_steps()})")
            if jax.process_index() == 0:
                moved = ckpt.set_aside_after(restore_step)
                if moved:
                    print(f"[train] resuming from step {restore_step}; later steps moved aside: "
                          f"{', '.join(p.name for p in moved)}")
            if jax.process_count() > 1:  # the others see the steps process 0 moved aside
                barrier(f"learner:set_aside:{ckpt.directory}")
                ckpt.manager.reload()
        self.state, meta = ckpt.restore(target, restore_step)
        self.start = int(meta["data_position"])

    def write(self, step: int, metrics: dict, tokens: int) -> None:
        self.writer.write(step, metrics, tokens)

    def write_eval(self, step: int, split: str, metrics: dict) -> None:
        self.writer.write_eval(step, split, metrics)

    # ---- steps
    def update(self, batch: dict | Sequence[dict]) -> dict:
        """One optimizer step -> its flat metrics (blocks until done). A list of sub-batches (one update split by
        sequence length) sums their gradients before one apply; the metrics combine as `combine_metrics`."""
        tr = self.tr
        if isinstance(batch, dict) or len(batch) == 1:
            b = batch if isinstance(batch, dict) else batch[0]
            self.state, m = tr.step_fn(self.state, self.frozen, shd.shard_batch(tr.mesh, b))
            return flatten_metrics(m)
        if self._grad is None:
            rep = shd.replicated(tr.mesh)
            self._grad = jax.jit(make_grad_fn(tr.mcfg, self.tc, tr.mesh), out_shardings=(tr.state_sh["trainable"], rep))
            self._apply = jax.jit(make_apply_fn(tr.tx, tr.schedule), out_shardings=(tr.state_sh, rep),
                                  donate_argnums=(0,))
        rng = jax.random.fold_in(self.state["rng"], self.state["step"])
        grads, parts = None, []
        for i, b in enumerate(batch):
            g, m = self._grad(self.state["trainable"], self.frozen, shd.shard_batch(tr.mesh, b),
                              jax.random.fold_in(rng, i))
            grads = g if grads is None else jax.tree.map(jnp.add, grads, g)
            parts.append((flatten_metrics(m), float(b["loss_mask"].sum())))
        self.state, m = self._apply(self.state, grads)
        return {**combine_metrics(parts), **flatten_metrics(m)}

    def score(self, batch: dict, state: dict | None = None):
        """(per-token log-probs [B,T] at train.sampling_temperature, values or None) of a batch (tokens,
        positions, segment ids; a prefix tree's arrays) under the current params (or those of `state`)."""
        if self._score is None:
            self._score = jax.jit(under_mesh(make_score_fn(self.tr.mcfg, self.tc), self.tr.mesh))
        st = self.state if state is None else state
        return self._score(st["trainable"], self.frozen, shd.shard_batch(self.tr.mesh, batch))

    def check_finite(self, losses: Sequence[float], where: str) -> None:
        """NonFiniteLoss naming `where` and the last good checkpoint when any loss is not finite."""
        if all(math.isfinite(x) for x in losses):
            return
        last = self.ckpt.latest_step() if self.ckpt is not None else None
        raise NonFiniteLoss(f"loss is {losses[0] if len(losses) == 1 else list(losses)} at {where}; stopped; last good "
                            "checkpoint: "
                            f"{'none' if last is None else self.ckpt.directory / str(last)}")

    # ---- checkpoints and preemption
    def arm(self) -> None:
        """From here, SIGTERM (under jaxrag.main) is honoured at the end of a step (end_step)."""
        preemption.arm()

    def end_step(self, step: int, total_steps: int, meta: dict) -> None:
        """After step `step`: a checkpoint every train.checkpoint.every_steps and at the last step (meta: what else
        it records; step and data_position are added); on a requested preemption, the step saved and Preempted
        raised (agreed over processes)."""
        meta = {"step": step, "data_position": step, **meta}
        if self.ckpt is not None and (step % self.tc.checkpoint.every_steps == 0 or step == total_steps):
            self.ckpt.save(step, self.state, meta)
        if step < total_steps and preemption.requested():
            preemption.stop(self.ckpt, step, self.state, meta)

    def finish(self, step: int, meta: dict) -> None:
        """A checkpoint of the last step done, where none was saved (a batch stream that ended early)."""
        if self.ckpt is not None and step > self.start and self.ckpt.latest_step() != step:
            self.ckpt.save(step, self.state, {"step": step, "data_position": step, **meta})

    def close(self) -> None:
        preemption.disarm()
        if self.ckpt is not None:
            self.ckpt.close()
        if self.writer is not None:
            self.writer.close()


ADDITIVE = ("loss", "ppo/pg_loss", "ppo/vf_loss")  # Σ w·x with whole-update weights: partial sums add up


def combine_metrics(parts: Sequence[tuple[dict, float]]) -> dict:
    """Metrics of the sub-batches of one update -> the update's: the additive losses summed, *_max_dev maxed,
    the token means (kl/*, clip_fraction) weighted by each sub-batch's action tokens."""
    total = max(sum(n for _, n in parts), 1.0)
    out = {}
    for k in parts[0][0]:
        vals = [m[k] for m, _ in parts]
        if k in ADDITIVE:
            out[k] = float(np.sum(vals))
        elif k.endswith("_max_dev"):
            out[k] = float(np.max(vals))
        else:
            out[k] = float(sum(v * n for v, (_, n) in zip(vals, parts)) / total)
    return out


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
