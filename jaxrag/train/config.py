"""The trainer's configuration (an ml_collections ConfigDict with every key and its type) and its validation.

Defaults follow METHODS.md §4 where the papers publish a setting. The dict is locked: a misspelled key fails at
once; `validate` checks values before any compute and names the offending key.
"""

from __future__ import annotations

import ml_collections

from jaxrag import losses
from jaxrag.models.lora import TARGETS
from jaxrag.train import objectives


def default_train_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.loss = "sft"  # sft | dpo | bt (critic / PRM, Bradley–Terry) | grpo | ppo | "module.path:attribute"
    c.loss_opts = ml_collections.ConfigDict()  # the loss's own settings (an Objective's `options`; docs/ablations.md)
    c.seed = 0
    c.steps = 100
    c.batch_size = 8  # global: examples (sft), pairs (dpo, bt), prompts x group_size rows (grpo), rows (ppo)
    c.grad_accum = 1  # microbatches per step (batch_size must be divisible)
    c.seq_buckets = (64, 128, 256, 512)
    c.mesh = (-1, 1, 1)  # (data, fsdp, tensor); -1 = all remaining devices
    c.compute_dtype = "float32"  # model matmul dtype (bfloat16 for mixed precision); params stay param_dtype
    c.remat = False  # rematerialize each layer in the backward pass
    # grpo/ppo: the behaviour policy's sampling temperature T; policy and reference log-probs are
    # log_softmax(logits / T), the values jaxrag.sampling.generate records, so the importance ratio is exact at T != 1
    c.sampling_temperature = 1.0

    c.optimizer = ml_collections.ConfigDict()
    c.optimizer.lr = 1e-5
    c.optimizer.warmup_steps = 0
    c.optimizer.min_lr_ratio = 0.0  # the schedule decays to lr * min_lr_ratio at `steps`
    c.optimizer.schedule = "cosine"  # "cosine" (after warmup) | "wsd" (warmup-stable-decay: steps.lr_schedule)
    c.optimizer.decay_fraction = 0.2  # wsd: the share of the steps, at the end, that decay
    c.optimizer.weight_decay = 0.0
    c.optimizer.b1 = 0.9
    c.optimizer.b2 = 0.999
    c.optimizer.eps = 1e-8
    c.optimizer.clip_norm = 1.0  # 0 = no clipping

    c.lora = ml_collections.ConfigDict()
    c.lora.enabled = False
    c.lora.rank = 8
    c.lora.alpha = 16.0
    c.lora.dropout = 0.0
    c.lora.targets = ("q", "k", "v")

    c.sft = ml_collections.ConfigDict({"reduction": "token"})
    c.dpo = ml_collections.ConfigDict({"beta": 0.1, "label_smoothing": 0.0, "loss_type": "sigmoid"})
    c.bt = ml_collections.ConfigDict({"center_coef": 0.0})
    c.grpo = ml_collections.ConfigDict({
        "group_size": 4, "clip_eps": 0.2, "beta": 0.04, "kl_estimator": "k2",
        "aggregation": "seq_mean_token_mean", "kl_clamp": 0.0,  # 0 = no clamp
        "adv_eps": 1e-4, "std_ddof": 1,
    })
    c.ppo = ml_collections.ConfigDict({
        "clip_eps": 0.2, "value_clip_eps": 0.2, "vf_coef": 0.5, "gamma": 1.0, "lam": 0.95, "whiten": True,
    })

    # restore_step: resume from this saved step instead of the latest (0 = latest); the later steps (e.g. a corrupt
    # latest one) are moved aside to checkpoints/<step>.set_aside, never deleted
    c.checkpoint = ml_collections.ConfigDict({"enabled": True, "every_steps": 50, "keep": 3, "async_save": True,
                                              "restore_step": 0})
    c.log_every = 1
    c.progress = True  # tqdm bar
    c.lock()
    return c


def _fail(key: str, msg: str):
    raise ValueError(f"train config: {key}: {msg}")


def validate(c: ml_collections.ConfigDict) -> None:
    obj = objectives.get(c.loss)   # a table name or "module.path:attribute" (raises naming the key)
    objectives.loss_options(c)
    for key in ("steps", "batch_size", "grad_accum"):
        if int(c[key]) < 1:
            _fail(key, f"must be >= 1, got {c[key]}")
    if c.batch_size % c.grad_accum:
        _fail("grad_accum", f"batch_size {c.batch_size} is not divisible by grad_accum {c.grad_accum}")
    if len(tuple(c.mesh)) != 3:
        _fail("mesh", f"needs 3 entries (data, fsdp, tensor), got {tuple(c.mesh)}")
    if c.compute_dtype not in ("float32", "bfloat16", "float16"):
        _fail("compute_dtype", f"{c.compute_dtype!r} is not float32/bfloat16/float16")
    if not c.seq_buckets or any(int(b) < 2 for b in c.seq_buckets):
        _fail("seq_buckets", f"needs lengths >= 2, got {tuple(c.seq_buckets)}")
    if c.sampling_temperature <= 0:
        _fail("sampling_temperature", f"must be > 0 (greedy samples are scored at T = 1), got {c.sampling_temperature}")
    if c.optimizer.lr <= 0:
        _fail("optimizer.lr", f"must be > 0, got {c.optimizer.lr}")
    if c.optimizer.warmup_steps < 0 or c.optimizer.warmup_steps > c.steps:
        _fail("optimizer.warmup_steps", f"must be in [0, steps={c.steps}], got {c.optimizer.warmup_steps}")
    if c.optimizer.schedule not in ("cosine", "wsd"):
        _fail("optimizer.schedule", f"{c.optimizer.schedule!r} is not 'cosine' or 'wsd'")
    if not 0.0 < c.optimizer.decay_fraction <= 1.0:
        _fail("optimizer.decay_fraction", f"must be in (0, 1], got {c.optimizer.decay_fraction}")
    if c.lora.enabled:
        bad = [t for t in c.lora.targets if t not in TARGETS]
        if bad:
            _fail("lora.targets", f"unknown {bad}; choose from {tuple(TARGETS)}")
        if c.lora.rank < 1:
            _fail("lora.rank", f"must be >= 1, got {c.lora.rank}")
        if not 0.0 <= c.lora.dropout < 1.0:
            _fail("lora.dropout", f"must be in [0, 1), got {c.lora.dropout}")
    if c.sft.reduction not in losses.SFT_REDUCTIONS:
        _fail("sft.reduction", f"{c.sft.reduction!r} is not one of {losses.SFT_REDUCTIONS}")
    if c.dpo.loss_type not in losses.DPO_LOSS_TYPES:
        _fail("dpo.loss_type", f"{c.dpo.loss_type!r} is not one of {losses.DPO_LOSS_TYPES}")
    if c.dpo.beta <= 0:
        _fail("dpo.beta", f"must be > 0, got {c.dpo.beta}")
    if ":" in str(c.grpo.kl_estimator):
        losses.kl_estimator_fn(c.grpo.kl_estimator, "train config: grpo.kl_estimator")   # fails in one line
    elif c.grpo.kl_estimator not in losses.KL_ESTIMATORS:
        _fail("grpo.kl_estimator", f"{c.grpo.kl_estimator!r} is not one of {losses.KL_ESTIMATORS} or "
                                   "'module.path:function'")
    if c.grpo.aggregation not in losses.GRPO_AGGREGATIONS:
        _fail("grpo.aggregation", f"{c.grpo.aggregation!r} is not one of {losses.GRPO_AGGREGATIONS}")
    if obj.layout == "groups" and c.batch_size % c.grpo.group_size:
        _fail("batch_size", f"{c.batch_size} rows do not split into groups of grpo.group_size={c.grpo.group_size}")
    if c.checkpoint.every_steps < 1 or c.checkpoint.keep < 1:
        _fail("checkpoint", "every_steps and keep must be >= 1")
    if c.checkpoint.restore_step < 0:
        _fail("checkpoint.restore_step", f"must be >= 0 (0 = the latest), got {c.checkpoint.restore_step}")


def resolve(overrides: dict | ml_collections.ConfigDict | None = None, check: bool = True) -> ml_collections.ConfigDict:
    """Defaults updated by `overrides` (nested dict / ConfigDict); unknown keys and wrong types raise. check=False
    leaves `validate` to a caller that sets keys of its own first (the RL loop's batch size)."""
    c = default_train_config()
    if overrides is not None:
        _update(c, overrides, "")
    if check:
        validate(c)
    return c


def _update(c: ml_collections.ConfigDict, upd, prefix: str) -> None:
    for k, v in upd.items():
        key = f"{prefix}{k}"
        if key.startswith("loss_opts."):   # the loss's own settings: any key (loss_options checks them)
            with c.unlocked():
                c[k] = v
            continue
        if k not in c:
            raise KeyError(f"train config: unknown key {key!r}")
        if isinstance(c[k], ml_collections.ConfigDict):
            _update(c[k], v, key + ".")
        else:
            try:
                c[k] = tuple(v) if isinstance(c[k], tuple) and isinstance(v, (list, tuple)) else v
            except TypeError as e:
                raise TypeError(f"train config: {key}: {e}") from None
