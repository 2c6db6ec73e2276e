"""Evaluation: agent x dataset -> episodes JSONL + metrics + a RAG-Gym-Table-2-style markdown/CSV table.

Function API: `evaluate(policy, retriever, agent, examples, ...) -> (episodes, metrics)`.
Stage API: `eval_stage(config, workdir)` reads `config.eval` (see configs/eval_*.py) and writes
`workdir/eval/{method}__{dataset}.episodes.jsonl`, `metrics.jsonl`, `table.md`, `table.csv`, `DONE`.
"""
from __future__ import annotations

import csv
import importlib
import io
import json
import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from jaxrag import metrics as M
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import Episode, write_episodes
from jaxrag.env.rollout import RolloutConfig, rollout

log = logging.getLogger(__name__)


def episode_metrics(episodes: Sequence[Episode], judge=None) -> dict:
    """Aggregate metrics (fractions in [0, 1]) over finished episodes."""
    n = len(episodes)
    if n == 0:
        return {"n": 0}
    mc = any(ep.choices for ep in episodes)
    em = [M.exact_match(ep.answer, ep.gold) for ep in episodes]
    f1 = [M.f1_score(ep.answer, ep.gold) for ep in episodes]
    out: dict[str, Any] = {
        "n": n,
        "em": float(np.mean(em)), "f1": float(np.mean(f1)),
        "cem": float(np.mean([M.cover_exact_match(ep.answer, ep.gold) for ep in episodes])),
        "answered": float(np.mean([ep.answer is not None for ep in episodes])),
        "invalid_rate": M.invalid_rate([ep.num_invalid for ep in episodes], [len(ep.steps) for ep in episodes]),
        "episodes_with_invalid": float(np.mean([ep.num_invalid > 0 for ep in episodes])),
        "steps_mean": float(np.mean([len(ep.steps) for ep in episodes])),
        "return_mean": float(np.mean([ep.ret for ep in episodes])),
        "se": M.search_efficiency(f1, [ep.num_searches for ep in episodes]),
    }
    if mc:
        out["acc"] = float(np.mean([M.choice_accuracy(ep.answer, ep.gold, ep.choices) for ep in episodes]))
    out.update({f"searches_{k}": v for k, v in M.search_count_stats(ep.num_searches for ep in episodes).items()})
    for reason in ("answer", "max_steps", "invalid"):
        out[f"done_{reason}"] = float(np.mean([ep.done == reason for ep in episodes]))
    if any(ep.agent == "arena" for ep in episodes):
        fmt, rel = [], []
        for ep in episodes:
            raw = ep.steps[-1].action.raw if ep.steps else ""
            fmt.append(M.arena_format_score(raw))
            pred = ep.steps[-1].action.extra.get("relevance", []) if ep.steps else []
            rel.append(M.arena_relevance_score(pred, ep.metadata.get("gold_ref_ids", [])))
        out["arena_format"], out["arena_relevance"] = float(np.mean(fmt)), float(np.mean(rel))
    if judge is not None:
        verdicts = [judge.judge_answer(ep.gold, ep.answer) for ep in episodes]
        ok = [v for v in verdicts if v is not None]
        out["lj"] = float(np.mean(ok)) if ok else float("nan")
        out["lj_errors"] = sum(v is None for v in verdicts)
    return out


def evaluate(policy, retriever, agent, examples: Sequence, *, cfg: RolloutConfig | None = None, judge=None,
             out_path: str | Path | None = None, select=None, summarizer=None, **overrides) -> tuple[list[Episode], dict]:
    """Roll out `agent` on `examples`; returns (episodes, metrics). `overrides` update the RolloutConfig."""
    cfg = cfg or RolloutConfig()
    if overrides:
        import dataclasses
        cfg = dataclasses.replace(cfg, **overrides)
    stats: dict = {}
    episodes = rollout(policy, retriever, agent, examples, cfg, select=select, summarizer=summarizer, stats=stats)
    m = episode_metrics(episodes, judge=judge)
    m["timing"] = {k: round(v, 4) if isinstance(v, float) else v for k, v in stats.items()}
    if stats.get("total_s"):
        m["episodes_per_s"] = len(episodes) / stats["total_s"]
    if out_path is not None:
        write_episodes(out_path, episodes)
    return episodes, m


# ---- tables ---------------------------------------------------------------------------------------------
def _is_mc(metrics: dict) -> bool:
    return "acc" in metrics


def results_table(results: dict[str, dict[str, dict]], datasets: Sequence[str] | None = None) -> tuple[str, str]:
    """results[method][dataset] = metrics -> (markdown, csv), laid out like RAG-Gym Table 2:
    EM / F1 per open-domain dataset, Acc for multiple choice, then Avg EM / Avg F1 over open-domain ones
    (and Avg over all datasets, counting Acc for MC and F1 otherwise). Values in percent."""
    datasets = list(datasets or dict.fromkeys(d for r in results.values() for d in r))
    mc = {d: any(_is_mc(r.get(d, {})) for r in results.values()) for d in datasets}
    header = ["Method"]
    for d in datasets:
        header += [f"{d} Acc"] if mc[d] else [f"{d} EM", f"{d} F1"]
    header += ["Avg EM", "Avg F1"] + (["Avg"] if any(mc.values()) else [])
    rows = []
    for method, per in results.items():
        row: list[Any] = [method]
        ems, f1s, alls = [], [], []
        for d in datasets:
            m = per.get(d)
            if m is None or not m.get("n"):
                row += [None] if mc[d] else [None, None]
                continue
            if mc[d]:
                row.append(100 * m["acc"])
                alls.append(100 * m["acc"])
            else:
                row += [100 * m["em"], 100 * m["f1"]]
                ems.append(100 * m["em"])
                f1s.append(100 * m["f1"])
                alls.append(100 * m["f1"])
        row += [np.mean(ems) if ems else None, np.mean(f1s) if f1s else None]
        if any(mc.values()):
            row.append(np.mean(alls) if alls else None)
        rows.append(row)
    fmt = lambda v: "-" if v is None else (f"{v:.2f}" if isinstance(v, (float, np.floating)) else str(v))
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    for r in rows:
        w.writerow(["" if v is None else (round(float(v), 4) if not isinstance(v, str) else v) for v in r])
    return "\n".join(md) + "\n", buf.getvalue()


# ---- the stage --------------------------------------------------------------------------------------------
def _call(spec: str, *args, **kw):
    mod, _, fn = spec.partition(":")
    if not fn:
        raise ValueError(f"expected 'module.path:function', got {spec!r}")
    return getattr(importlib.import_module(mod), fn)(*args, **kw)


def _plain(v):
    return v.to_dict() if hasattr(v, "to_dict") else v


def _resolve(p, workdir) -> Path:
    p = Path(p)
    return p if p.is_absolute() else Path(workdir) / p


def load_policy(pcfg, workdir: str | Path):
    """Default policy builder: a local HF checkpoint dir -> JaxPolicy. Keys: `path` (relative to workdir or
    absolute), optional `tokenizer` (a separate tokenizer dir / *.model; default: `path`), `dtype`,
    `max_prompt_tokens`, `top_k`, `top_p`."""
    from jaxrag.models.hf import load_hf
    from jaxrag.policy import JaxPolicy
    from jaxrag.tokenizer import load_tokenizer
    if not pcfg.get("path"):
        raise ValueError("eval.policy needs 'path' (a Hugging Face checkpoint dir) or 'fn'")
    path = _resolve(pcfg["path"], workdir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"eval.policy.path: {path} is not a checkpoint dir (no config.json)")
    tok_path = _resolve(pcfg["tokenizer"], workdir) if pcfg.get("tokenizer") else path
    cfg, params = load_hf(path, dtype=pcfg.get("dtype"))
    tok = load_tokenizer(tok_path)
    if tok.vocab_size > cfg.vocab_size:
        raise ValueError(f"eval.policy: tokenizer {tok_path} has {tok.vocab_size} tokens but the model in {path} "
                         f"has vocab_size {cfg.vocab_size}")
    return JaxPolicy(cfg, params, tok, top_k=pcfg.get("top_k", 0), top_p=pcfg.get("top_p", 1.0),
                     max_prompt_tokens=pcfg.get("max_prompt_tokens"))


def load_index(rcfg, workdir: str | Path):
    """Default retriever builder: `index_dir` (built index) or `corpus` (a JSONL: BM25 built in memory)."""
    from jaxrag import retrieval
    if rcfg.get("index_dir"):
        return retrieval.load_retriever(_resolve(rcfg["index_dir"], workdir), kind=rcfg.get("kind", "bm25"),
                                        backend=rcfg.get("backend", "bm25s"))
    if rcfg.get("corpus"):
        corpus = _resolve(rcfg["corpus"], workdir)
        return retrieval.build_bm25(retrieval.load_corpus(corpus), backend=rcfg.get("backend", "bm25s"))
    raise ValueError("eval.retriever needs 'index_dir' or 'corpus'")


def eval_stage(config, workdir: str | Path) -> dict:
    """Stage `eval`: for every (agent, dataset) in config.eval, episodes JSONL + metrics + tables."""
    from jaxrag.data.qa import load_qa
    from jaxrag.judge import judge_from_config
    ec = config.eval
    out_dir = Path(workdir) / ec.get("out_subdir", "eval")
    out_dir.mkdir(parents=True, exist_ok=True)
    pcfg, rcfg = _plain(ec.policy), _plain(ec.retriever)
    policy = _call(pcfg.get("fn", "jaxrag.evaluate:load_policy"), pcfg, workdir)
    retriever = _call(rcfg.get("fn", "jaxrag.evaluate:load_index"), rcfg, workdir)
    judge = judge_from_config(_plain(ec.get("judge", None)))
    rc = RolloutConfig(**_plain(ec.get("rollout", {})))
    results: dict[str, dict[str, dict]] = {}
    metrics_path = out_dir / "metrics.jsonl"
    metrics_path.write_text("")
    for a in _plain(ec.agents):
        a = {"name": a} if isinstance(a, str) else dict(a)
        opts = dict(a.get("opts", {}))
        if opts.get("mode", "chat") == "chat" and "tokenizer" not in opts:
            opts["tokenizer"] = getattr(policy, "tokenizer", None)
        agent = get_agent(a["name"], **opts)
        method = a.get("method", a["name"])
        for d in _plain(ec.datasets):
            examples = load_qa(d["path"], d.get("select"), limit=d.get("limit"))
            name = d.get("name", Path(d["path"]).stem)
            log.info("eval %s on %s (%d questions)", method, name, len(examples))
            _, m = evaluate(policy, retriever, agent, examples, cfg=rc, judge=judge,
                            out_path=out_dir / f"{method}__{name}.episodes.jsonl")
            results.setdefault(method, {})[name] = m
            with metrics_path.open("a") as f:
                f.write(json.dumps({"method": method, "dataset": name, **m}) + "\n")
    md, csv_text = results_table(results)
    (out_dir / "table.md").write_text(md)
    (out_dir / "table.csv").write_text(csv_text)
    (out_dir / "DONE").write_text("")
    return results
