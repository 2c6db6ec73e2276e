"""The generic training stage: `train_stage(config, workdir, name)` trains config[name].train.loss on a JSONL file.

config[name] (see configs/common/train.py: train_stage()):
  fn      "jaxrag.pipelines.train:train_stage"
  data    JSONL path, relative to the workdir (or absolute)
  init    "random" (config.model: ModelConfig fields, seed train.seed) | "stage:<name>" (workdir/<name>/model) | a dir
  tokenizer  "" (records hold token ids) or a tokenizer path (records hold text; also copied beside the model):
             absolute, relative to the workdir, or "stage:<name>" (that stage's model dir)
  train   the trainer config (jaxrag.train.config.default_train_config()); its `loss` picks the record layout
  train_layout  optional, "auto" (default) | "rows" | "tree": DPO and critic pairs whose chosen and rejected share
          the prompt packed as a prefix tree (jaxrag.train.prefix_tree; auto: where its cost model says it saves
          work); GRPO groups (their completions share the prompt) on the tree when "tree" is set (auto keeps their
          per-row batches, whose device-side advantages also log reward/mean and reward/std); SFT trains on rows
  epochs  optional, 0 = off: train for this many passes over the data instead of `train.steps`:
          steps = ceil(epochs * rows / batch) (batch = train.batch_size examples; groups: batch_size / group_size),
          logged and written to summary.json (the released RAG-Gym code trains by epochs: TRL num_train_epochs)
Outputs: workdir/<name>/{checkpoints/, metrics.jsonl, tb/, train_config.json, model/ (HF checkpoint), summary.json}

JSONL records (ids or text):
  sft   {"prompt_ids": [...], "completion_ids": [...]}              | {"prompt": str, "completion": str}
  labeled {"prompt_ids", "completion_ids", "label"}                 | {"prompt", "completion", "label"}
        (label: true / false or 1 / 0: desirable or not; KTO on completions without a partner)
  pairs {"prompt_ids", "chosen_ids", "rejected_ids"}                | {"prompt", "chosen", "rejected"}
  group {"prompt_ids", "completions_ids": [[...]], "rewards": [...]} | {"prompt", "completions": [str], "rewards"}
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import numpy as np

from jaxrag.jsonl import iter_jsonl
from jaxrag.models import ModelConfig, init_params
from jaxrag.models.hf import stored_dtype
from jaxrag.pipelines.common import load_checkpoint, model_dir, resolve, save_checkpoint, write_json
from jaxrag.rl.rows import group_batch_auto
from jaxrag.tokenizer import load_tokenizer
from jaxrag.train import config as tconfig
from jaxrag.train.batching import (BatchStream, Group, LabeledExample, PreferencePair, SFTExample, group_batch,
                                   labeled_batch, pair_batch, sft_batch)
from jaxrag.train.distributed import barrier, is_lead
from jaxrag.train.loop import fit, save_summary
from jaxrag.train import objectives
from jaxrag.train.prefix_tree import check_layout, pair_batch_auto


class DataError(ValueError):
    pass


def _records(path: Path) -> list[tuple[str, dict]]:
    """jaxrag.jsonl.iter_jsonl's [(where = "file:line", record)]; a missing or empty data file is an error."""
    if not path.exists():
        raise DataError(f"{path}: no such file")
    out = list(iter_jsonl(path, DataError))
    if not out:
        raise DataError(f"{path}: empty (no records)")
    return out


def _ids(rec: dict, key: str, where: str, tok) -> list[int]:
    if f"{key}_ids" in rec:
        v = rec[f"{key}_ids"]
        if not isinstance(v, list) or not all(isinstance(x, int) and x >= 0 for x in v):
            raise DataError(f"{where}: '{key}_ids' must be a list of non-negative ints")
        return v
    if key in rec:
        if tok is None:
            raise DataError(f"{where}: text field '{key}' needs <stage>.tokenizer to be set")
        return tok.encode(rec[key])
    raise DataError(f"{where}: missing '{key}_ids' (or '{key}' text)")


def load_examples(kind: str, path: Path, tok=None, vocab_size: int | None = None) -> list:
    out = []
    for where, rec in _records(path):
        if kind == "sft":
            ex = SFTExample(_ids(rec, "prompt", where, tok), _ids(rec, "completion", where, tok))
            ids = ex.prompt + ex.completion
        elif kind == "labeled":
            label = rec.get("label")
            if label not in (True, False, 0, 1):
                raise DataError(f"{where}: 'label' must be true / false (or 1 / 0), got {label!r}")
            ex = LabeledExample(_ids(rec, "prompt", where, tok), _ids(rec, "completion", where, tok), float(label))
            ids = ex.prompt + ex.completion
        elif kind == "pairs":
            ex = PreferencePair(*(_ids(rec, k, where, tok) for k in ("prompt", "chosen", "rejected")))
            ids = ex.prompt + ex.chosen + ex.rejected
        else:
            prompt = _ids(rec, "prompt", where, tok)
            if "completions_ids" in rec:
                comps = rec["completions_ids"]
            elif "completions" in rec and tok is not None:
                comps = [tok.encode(c) for c in rec["completions"]]
            else:
                raise DataError(f"{where}: missing 'completions_ids' (or 'completions' text with a tokenizer)")
            rewards = rec.get("rewards")
            if not isinstance(rewards, list) or len(rewards) != len(comps):
                raise DataError(f"{where}: 'rewards' must be a list with one reward per completion")
            ex = Group(prompt, comps, [float(r) for r in rewards])
            ids = prompt + [t for c in comps for t in c]
        if vocab_size is not None and ids and max(ids) >= vocab_size:
            raise DataError(f"{where}: token id {max(ids)} >= vocab_size {vocab_size}")
        out.append(ex)
    return out


def load_model(config, stage: str, workdir: str):
    init = config[stage].init
    if init == "random":
        cfg = ModelConfig(**config.model.to_dict())
        return cfg, init_params(cfg, jax.random.PRNGKey(config[stage].train.seed))
    return load_checkpoint(resolve(init, workdir))  # absolute, relative to the workdir, or stage:<name>


def source_dtype(config, stage: str, workdir: str) -> str | None:
    """The dtype the stage's init checkpoint is stored in (a bf16 model is saved back as bf16); None for a random
    init (the weights' own dtype)."""
    init = config[stage].init
    return None if init == "random" else stored_dtype(resolve(init, workdir))


def _tokenizer(config, stage, workdir):
    path = config[stage].get("tokenizer", "")
    if not path:
        return None

    return load_tokenizer(resolve(path, workdir))


# The JSONL record kind and batch maker of each batch layout of the loss table (jaxrag.train.objectives).
LAYOUTS = {"sft": ("sft", sft_batch), "labeled": ("labeled", labeled_batch), "pairs": ("pairs", pair_batch),
           "groups": ("groups", group_batch)}


def train_stage(config, workdir: str, name: str) -> None:
    sc = config[name]
    tc = tconfig.resolve(sc.train)
    obj = objectives.objective(tc)
    layout = obj.layout
    if layout not in LAYOUTS:
        raise DataError(f"config.{name}.train.loss={tc.loss!r}: its '{layout}' batches are not read from files; "
                        "train it online in the rl stage (jaxrag.pipelines.rl)")
    kind = LAYOUTS[layout][0]
    cfg, params = load_model(config, name, workdir)
    tok = _tokenizer(config, name, workdir)
    examples = load_examples(kind, resolve(sc.data, workdir), tok, cfg.vocab_size)
    pad = cfg.pad_id if cfg.pad_id is not None else 0
    per_batch = examples_per_batch(tc, layout)
    if sc.get("epochs"):
        steps = epoch_steps(sc.epochs, len(examples), per_batch)
        print(f"[{name}] epochs={sc.epochs}: steps = ceil({sc.epochs} * {len(examples)} rows / {per_batch}) = {steps} "
              f"(train.steps={tc.steps} not used)", flush=True)
        tc.steps = steps
        tc.optimizer.warmup_steps = min(tc.optimizer.warmup_steps, steps)
        tconfig.validate(tc)
    layout = sc.get("train_layout", "auto")
    check_layout(layout, f"config.{name}.train_layout")
    out = Path(workdir) / name
    tok_file = resolve(sc.tokenizer, workdir) if sc.get("tokenizer") else None
    result = train_on_examples(cfg, params, examples, tc, workdir, name, layout=layout, pad_id=pad,
                               tokenizer_file=tok_file, dtype=source_dtype(config, name, workdir))
    if is_lead():
        save_summary(out / "summary.json", result)
        if sc.get("epochs"):
            summary = json.loads((out / "summary.json").read_text())
            summary.update(epochs=sc.epochs, rows=len(examples), steps=tc.steps)
            write_json(out / "summary.json", summary)


def examples_per_batch(tc, layout: str) -> int:
    """Examples in one batch of the loss's layout: tc.batch_size rows, or of groups tc.batch_size / group_size."""
    return tc.batch_size // tc.grpo.group_size if layout == "groups" else tc.batch_size


def train_on_examples(cfg, params, examples: list, tc, workdir, name: str, *, layout: str = "auto", pad_id: int = 0,
                      tokenizer_file=None, dtype: str | None = None):
    """Train tc.loss on in-memory examples of its layout and save workdir/<name>/model: the one path of every
    file-fed training stage (train_stage, the demo's preference stage).

    Args:
      cfg, params: the model config and the initial params.
      examples: SFTExample | LabeledExample | PreferencePair | Group, as the loss's layout reads.
      tc: the resolved trainer config.
      workdir, name: the stage's folder is workdir/<name> (checkpoints, metrics, model/).
      layout: "auto" | "rows" | "tree" (jaxrag.train.prefix_tree): pairs packed as a prefix tree where chosen. Groups
        only on "tree" (auto keeps their per-row batches, which also log reward/mean and reward/std).
      pad_id: the padding id of the batches.
      tokenizer_file, dtype: saved with the model (save_checkpoint).

    Returns:
      fit's FitResult.
    """
    obj = objectives.objective(tc)
    _, make = LAYOUTS[obj.layout]
    multiple = int(tc.grad_accum) * jax.device_count()   # tree packs split whole over devices x microbatches
    if obj.layout == "pairs" and layout != "rows":
        make = lambda ex, buckets, pad: pair_batch_auto(ex, buckets, cfg, layout, pad, multiple, obj.reads)
    elif obj.layout == "groups" and layout == "tree":
        g = tc.grpo
        make = lambda ex, buckets, pad: group_batch_auto(ex, buckets, cfg, layout, pad, multiple, g.group_size,
                                                         g.adv_eps, g.std_ddof, g.aggregation)
    stream = BatchStream(examples, examples_per_batch(tc, obj.layout),
                         lambda ex: make(ex, tuple(tc.seq_buckets), pad_id), seed=tc.seed)
    result = fit(cfg, params, stream, None, tc, Path(workdir) / name)
    # every process: sharded params are gathered, process 0 writes
    save_checkpoint(model_dir(workdir, name), cfg, result.params, tokenizer_file, head=result.head, dtype=dtype)
    return result


def epoch_steps(epochs: float, rows: int, batch: int) -> int:
    """Optimizer steps for `epochs` passes over `rows` examples at `batch` per step: ceil(epochs * rows / batch)."""
    return max(1, math.ceil(epochs * rows / batch - 1e-9))


def check_config(config, stage: str) -> None:
    """Static check run by jaxrag.main before any stage starts."""
    sc = config[stage]
    for key in ("data", "init", "train"):
        if key not in sc:
            raise ValueError(f"config.{stage}: missing '{key}'")
    try:
        tconfig.resolve(sc.train)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"config.{stage}.{e}") from None
    epochs = sc.get("epochs", 0)
    if isinstance(epochs, bool) or not isinstance(epochs, (int, float)) or epochs < 0:
        raise ValueError(f"config.{stage}.epochs: {epochs!r}: a number >= 0 (0: train.steps)")
    if sc.init == "random" and "model" not in config:
        raise ValueError(f"config.{stage}.init='random' needs config.model (ModelConfig fields)")


train_stage.check_config = check_config


def toy_data_stage(config, workdir: str, name: str) -> None:
    """A tiny copy task in token ids: prompt = [1, x..., 2], completion = x reversed. Writes sft/pairs/groups JSONL
    and labeled JSONL under workdir/<name>/ (for the example configs and tests)."""
    sc = config[name]
    rng = np.random.default_rng(sc.seed)
    out = Path(workdir) / name
    out.mkdir(parents=True, exist_ok=True)
    vocab = sc.vocab_size
    sft, pairs, groups, labeled = [], [], [], []
    for _ in range(sc.n):
        x = [int(t) for t in rng.integers(3, vocab, rng.integers(2, sc.max_len))]
        prompt, good = [1] + x + [2], x[::-1]
        bad = [int(t) for t in rng.integers(3, vocab, len(x))]
        sft.append({"prompt_ids": prompt, "completion_ids": good})
        pairs.append({"prompt_ids": prompt, "chosen_ids": good, "rejected_ids": bad})
        comps = [good] + [[int(t) for t in rng.integers(3, vocab, len(x))] for _ in range(sc.group_size - 1)]
        groups.append({"prompt_ids": prompt, "completions_ids": comps, "rewards": [1.0] + [0.0] * (sc.group_size - 1)})
        # unpaired: every prompt's right completion, a wrong one for every other prompt
        labeled += [{"prompt_ids": prompt, "completion_ids": good, "label": True}] + (
            [{"prompt_ids": prompt, "completion_ids": bad, "label": False}] if len(sft) % 2 else [])
    if is_lead():  # one writer; the others wait until the files are complete
        for kind, recs in (("sft", sft), ("pairs", pairs), ("groups", groups), ("labeled", labeled)):
            (out / f"{kind}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    barrier(f"toy_data:{out}")
