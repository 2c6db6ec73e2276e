"""SFT of the synthetic policy on the teacher's trajectories in an agent's plain format, through jaxrag.train.fit.

config[name]: agent, init_from ("" = a fresh model from config.model, else a stage whose model/ to start from),
only_correct, pack, max_len, eval_every (steps), eval_max_sequences, and `train` (the trainer config: steps,
batch_size, optimizer, ...). Outputs under workdir/<name>/: model/ (HF checkpoint + tokenizer), checkpoints/,
metrics.jsonl (train rows and teacher-forced eval rows on dev/heldout), tb/, summary.json, pool_questions.jsonl (the
train questions later stages sample from: the unseen pool, config.unseen_questions, which SFT does not train on; or
every train question when that is 0).
"""

from __future__ import annotations

import jax
import numpy as np

from jaxrag.data.synthetic import sft_data
from jaxrag.console import num, summary as fmt_summary
from jaxrag.env.agents import get_agent
from jaxrag.jsonl import write_jsonl
from jaxrag.models import ModelConfig, init_params
from jaxrag.pipelines.common import load_checkpoint, log, model_dir, save_checkpoint, stage_dir, write_json
from jaxrag.pipelines.synthetic import checks
from jaxrag.pipelines.synthetic.world import (load_questions, load_teacher_episodes, load_tokenizer, tokenizer_path,
                                              unseen_pool)
from jaxrag.train import config as tconfig
from jaxrag.train.distributed import is_lead
from jaxrag.train.loop import fit
from jaxrag.train.metrics_log import read_eval_metrics
from jaxrag.train.teacher_forced import make_eval_fn, rows_batch, teacher_forced


def model_config(config, tok):
    """config.model (ModelConfig fields) completed with the tokenizer's vocabulary and special ids."""
    return ModelConfig(**config.model.to_dict(), vocab_size=tok.vocab_size, bos_id=tok.bos_id,
                       eos_ids=tuple(tok.eos_ids), pad_id=tok.pad_id)


def sft_arrays(episodes, agent, tok, max_len: int, limit: int = 0, pack: bool = False) -> tuple[dict, dict]:
    """SFT arrays: one sequence per row (teacher-forced evaluation), or packed rows (training)."""
    seqs = [s for ep in episodes for s in sft_data.pack_episode(ep, agent, tok)]
    kept, dropped = sft_data.fit_length(seqs, max_len)
    if limit:
        kept = kept[:limit]
    if not kept:
        raise ValueError(f"no SFT sequence fits max_len={max_len} (dropped {dropped})")
    arrays = sft_data.pack_rows(kept, max_len, tok.pad_id) if pack else sft_data.to_arrays(kept, max_len, tok.pad_id)
    n_tokens = sum(len(s.tokens) for s in kept)
    return arrays, {
        "sequences": len(kept),
        "rows": len(arrays["tokens"]),
        "dropped_too_long": dropped,
        "max_tokens": max(len(s.tokens) for s in kept),
        "mean_tokens": n_tokens / len(kept),
        "fill": n_tokens / arrays["tokens"].size,
    }


class RandomRows:
    """Batches of rows drawn with replacement; batch i depends only on (seed, i), so `seek` resumes exactly."""

    def __init__(self, arrays: dict, batch_size: int, buckets, seed: int):
        self.arrays, self.batch_size, self.buckets, self.seed, self.position = arrays, batch_size, buckets, seed, 0

    def seek(self, position: int) -> None:
        self.position = position

    def __iter__(self):
        n = len(self.arrays["tokens"])
        while True:
            rows = np.random.default_rng([self.seed, self.position]).integers(0, n, self.batch_size)
            self.position += 1
            yield rows_batch(self.arrays, rows, self.buckets)


def teacher_forced_evals(workdir, splits, agent, tok, max_len: int, limit: int) -> dict:
    """Teacher-forced eval arrays on the teacher's correct trajectories of each split it has."""
    out = {}
    for split in splits:
        eps = [e for e in load_teacher_episodes(workdir, split) if e.reward > 0]
        out[split], _ = sft_arrays(eps, agent, tok, max_len, limit)
    return out


def sft_stage(config, workdir, name) -> None:
    s = config[name]
    tc = tconfig.resolve(s.train)
    tok = load_tokenizer(workdir)
    agent = get_agent(s.agent, mode="plain")
    train_eps = load_teacher_episodes(workdir, "train")
    unseen = unseen_pool(config, workdir)
    held = {q["id"] for q in unseen}
    train_eps = [e for e in train_eps if e.qid not in held]  # kept for the later stages (world.unseen_pool)
    if is_lead():  # multi-host: one writer (read by later stages, after jaxrag.main's barrier)
        write_jsonl(stage_dir(workdir, name) / "pool_questions.jsonl", unseen or load_questions(workdir, "train"))
    if s.only_correct:
        train_eps = [e for e in train_eps if e.reward > 0]
    train, train_info = sft_arrays(train_eps, agent, tok, s.max_len, pack=s.pack)
    evals = teacher_forced_evals(workdir, [x for x in ("dev", "heldout") if x in config.teacher.splits], agent, tok,
                                 s.max_len, s.eval_max_sequences)
    if s.init_from:
        mcfg, params = load_checkpoint(model_dir(workdir, s.init_from))
    else:
        mcfg = model_config(config, tok)
        params = init_params(mcfg, jax.random.PRNGKey(config.seed))
    n_params = int(sum(np.size(x) for x in jax.tree.leaves(params)))
    data = fmt_summary(train_info, ("sequences", "rows", "fill"))
    log(name, f"{s.agent}, {n_params:,} parameters, {tc.steps} steps on {data} "
              f"({len(held)} train questions kept out for later stages)")
    buckets = tuple(tc.seq_buckets)
    eval_fn = make_eval_fn(mcfg.replace(dtype=tc.compute_dtype))
    result = fit(
        mcfg, params, RandomRows(train, tc.batch_size, buckets, tc.seed), train_config=tc,
        workdir=stage_dir(workdir, name),
        evaluate=lambda p, step: {sp: teacher_forced(eval_fn, p, a, buckets) for sp, a in evals.items()},
        eval_every=s.eval_every,
    )
    save_checkpoint(model_dir(workdir, name), mcfg, result.params, tokenizer_path(workdir))  # every process
    if not is_lead():  # process 0 wrote metrics.jsonl and writes the summary
        return

    last = {r["split"]: r for r in read_eval_metrics(stage_dir(workdir, name) / "metrics.jsonl")}
    summary = {"agent": s.agent, "params": n_params, "train": train_info, "unseen_kept_out": len(held),
               "steps": result.step,
               "final_loss": result.metrics.get("loss"), "final_teacher_forced": last}
    write_json(stage_dir(workdir, name) / "summary.json", summary)
    log(name, summary_line(summary))


def summary_line(s: dict) -> str:
    """The SFT stage's result in one line: steps, last loss, and the teacher-forced score per eval split."""
    evals = "; ".join(f"{split} all actions right {num(r.get('all_actions_right'))}, action tokens "
                      f"{num(r.get('action_token_acc'))}" for split, r in s.get("final_teacher_forced", {}).items())
    return f"{s['steps']} steps, loss {num(s['final_loss'])}" + (f"; teacher-forced {evals}" if evals else "")


def sft_on_episodes(workdir, name: str, episodes, agent, init: str, max_len: int, train, info: dict | None = None):
    """SFT of stage `init`'s model on `episodes` (packed rows, loss on action tokens) through jaxrag.train.fit;
    saves workdir/<name>/model and summary.json; returns the summary."""
    tc = tconfig.resolve(train)
    arrays, data = sft_arrays(episodes, agent, load_tokenizer(workdir), max_len, pack=True)
    summary = {**(info or {}), **data, "episodes": len(episodes)}
    mcfg, params = load_checkpoint(model_dir(workdir, init))
    log(name, f"SFT on {len(episodes)} episodes: " + fmt_summary(data, ("sequences", "rows", "fill")))
    result = fit(mcfg, params, RandomRows(arrays, tc.batch_size, tuple(tc.seq_buckets), tc.seed), train_config=tc,
                 workdir=stage_dir(workdir, name))
    save_checkpoint(model_dir(workdir, name), mcfg, result.params, tokenizer_path(workdir))
    summary.update({"steps": result.step, "final_loss": result.metrics.get("loss")})
    if is_lead():
        write_json(stage_dir(workdir, name) / "summary.json", summary)
    log(name, fmt_summary(summary, ("steps", "final_loss", *(info or {}))))
    return summary


# jaxrag.main checks the config before any stage runs
sft_stage.check_config = checks.check_stage
