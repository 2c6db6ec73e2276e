"""Training stages for jaxrag.main: fn(config, workdir) reading JSONL from the workdir and writing under it.

config.<stage> (see configs/common/train.py: train_stage()):
  fn      "jaxrag.train.stages:sft_stage" | dpo_stage | bt_stage | grpo_stage
  data    JSONL path, relative to the workdir (or absolute)
  init    "random" (config.model.arch, seed train.seed) | "stage:<name>" (workdir/<name>/model) | an HF dir
  tokenizer  "" (records hold token ids) or a tokenizer path (records hold text)
  train   the trainer config (jaxrag.train.config.default_train_config())
Outputs: workdir/<stage>/{checkpoints/, metrics.jsonl, tb/, train_config.json, model/ (HF checkpoint), summary.json}

JSONL records (ids or text):
  sft   {"prompt_ids": [...], "completion_ids": [...]}              | {"prompt": str, "completion": str}
  pairs {"prompt_ids", "chosen_ids", "rejected_ids"}                | {"prompt", "chosen", "rejected"}
  group {"prompt_ids", "completions_ids": [[...]], "rewards": [...]} | {"prompt", "completions": [str], "rewards"}
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np

from jaxrag.models import ModelConfig, init_params, load_hf, save_hf
from jaxrag.train import config as tconfig
from jaxrag.train.batching import BatchStream, Group, PreferencePair, SFTExample, group_batch, pair_batch, sft_batch
from jaxrag.train.loop import fit, save_summary


class DataError(ValueError):
    pass


def _path(workdir: str, p: str) -> Path:
    p = Path(p)
    return p if p.is_absolute() else Path(workdir) / p


def read_jsonl(path: Path) -> list[tuple[int, dict]]:
    if not path.exists():
        raise DataError(f"{path}: no such file")
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((i, json.loads(line)))
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{i}: invalid JSON: {e.msg}") from None
    if not out:
        raise DataError(f"{path}: no records")
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
    for line, rec in read_jsonl(path):
        where = f"{path}:{line}"
        if kind == "sft":
            ex = SFTExample(_ids(rec, "prompt", where, tok), _ids(rec, "completion", where, tok))
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
        cfg = ModelConfig(**config.model.arch.to_dict())
        return cfg, init_params(cfg, jax.random.PRNGKey(config[stage].train.seed))
    path = Path(workdir) / init.split(":", 1)[1] / "model" if init.startswith("stage:") else Path(init)
    return load_hf(path)


def _tokenizer(config, stage):
    path = config[stage].get("tokenizer", "")
    if not path:
        return None
    from jaxrag.tokenizer import load_tokenizer

    return load_tokenizer(path)


def _run(config, workdir: str, stage: str, kind: str, make) -> None:
    sc = config[stage]
    tc = tconfig.resolve(sc.train)
    cfg, params = load_model(config, stage, workdir)
    examples = load_examples(kind, _path(workdir, sc.data), _tokenizer(config, stage), cfg.vocab_size)
    pad = cfg.pad_id if cfg.pad_id is not None else 0
    per_batch = tc.batch_size // tc.grpo.group_size if kind == "groups" else tc.batch_size
    stream = BatchStream(examples, per_batch, lambda ex: make(ex, tuple(tc.seq_buckets), pad), seed=tc.seed)
    out = Path(workdir) / stage
    result = fit(cfg, params, stream, tc.loss, tc, out)
    if jax.process_index() == 0:
        save_hf(cfg, jax.device_get(result.params), out / "model")
        if result.head is not None:
            np.savez(out / "head.npz", **jax.device_get(result.head))
        save_summary(out / "summary.json", result)


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
    if sc.init == "random" and "arch" not in config.get("model", {}):
        raise ValueError(f"config.{stage}.init='random' needs config.model.arch")


def sft_stage(config, workdir: str) -> None:
    _run(config, workdir, _current(config, "sft_stage"), "sft", sft_batch)


def _current(config, fn_name: str) -> str:
    names = [s for s in config.stages if config[s].fn.endswith(":" + fn_name)]
    if len(names) != 1:
        raise ValueError(f"cannot tell which stage runs {fn_name}: {names}")
    return names[0]


def dpo_stage(config, workdir: str) -> None:
    _run(config, workdir, _current(config, "dpo_stage"), "pairs", pair_batch)


def bt_stage(config, workdir: str) -> None:
    _run(config, workdir, _current(config, "bt_stage"), "pairs", pair_batch)


def grpo_stage(config, workdir: str) -> None:
    _run(config, workdir, _current(config, "grpo_stage"), "groups", group_batch)


for _f in (sft_stage, dpo_stage, bt_stage, grpo_stage):
    _f.check_config = check_config


def toy_data_stage(config, workdir: str) -> None:
    """A tiny copy task in token ids: prompt = [1, x..., 2], completion = x reversed. Writes sft/pairs/groups JSONL
    under workdir/<stage>/ (for the example configs and tests)."""
    sc = config[_current(config, "toy_data_stage")]
    rng = np.random.default_rng(sc.seed)
    out = Path(workdir) / _current(config, "toy_data_stage")
    out.mkdir(parents=True, exist_ok=True)
    vocab = sc.vocab_size
    sft, pairs, groups = [], [], []
    for _ in range(sc.n):
        x = [int(t) for t in rng.integers(3, vocab, rng.integers(2, sc.max_len))]
        prompt, good = [1] + x + [2], x[::-1]
        bad = [int(t) for t in rng.integers(3, vocab, len(x))]
        sft.append({"prompt_ids": prompt, "completion_ids": good})
        pairs.append({"prompt_ids": prompt, "chosen_ids": good, "rejected_ids": bad})
        comps = [good] + [[int(t) for t in rng.integers(3, vocab, len(x))] for _ in range(sc.group_size - 1)]
        groups.append({"prompt_ids": prompt, "completions_ids": comps, "rewards": [1.0] + [0.0] * (sc.group_size - 1)})
    for name, recs in (("sft", sft), ("pairs", pairs), ("groups", groups)):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
