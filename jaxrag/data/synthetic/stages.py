"""Stages of the synthetic pipeline (configs/synthetic/pipeline.py): fn(config, workdir), outputs under workdir.

world -> index -> teacher -> tokenizer -> sft (ReAct format) -> sft_re2search (Re²Search format, from sft)
-> eval (rollouts of every system on the eval splits) -> report (tables + PNG plots). Later stages (process
rewards, DPO, critic, GRPO) are added as config sections with their own fn and an eval system naming their model.
"""

from __future__ import annotations

import collections
import json
import os
import time

import numpy as np

from jaxrag.data.synthetic import export, questions as Q, sft_data, teacher as T
from jaxrag.data.synthetic.world import generate_world

TINY = {  # --config.scale=tiny: the whole pipeline in well under 2 minutes (CI)
    "world": {"n_countries": 4, "n_cities": 12, "n_persons": 60, "n_films": 30, "n_companies": 12},
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 2, "head_dim": 16, "d_ff": 64},
    "sft": {"time_budget_s": 8.0, "eval_every_s": 4.0, "eval_max_sequences": 32, "batch_size": 16},
    "sft_re2search": {"time_budget_s": 4.0, "eval_every_s": 2.0, "eval_max_sequences": 32, "batch_size": 16},
    "eval": {"max_questions": 24, "max_steps": 4, "max_new_tokens": 16},
}


def settings(config, name: str) -> dict:
    """config[name] as a dict, with the scale preset (config.scale) applied on top."""
    out = dict(config[name].to_dict()) if name in config else {}
    scale = config.get("scale", "demo")
    if scale not in ("demo", "tiny"):
        raise ValueError(f"config.scale={scale!r}: choose 'demo' or 'tiny'")
    if scale == "tiny":
        out.update(TINY.get(name, {}))
    return out


def _path(workdir, *parts) -> str:
    p = os.path.join(str(workdir), *parts)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    return p


def _write_json(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


def _log(name: str, msg: str) -> None:
    print(f"[{name}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------ world
def world_stage(config, workdir) -> None:
    s = settings(config, "world")
    w = generate_world(
        config.seed, s["n_countries"], s["n_cities"], s["n_persons"], s["n_films"], s["n_companies"], s["heldout_frac"]
    )
    qs = Q.generate_questions(w, tuple(s["split_fractions"]), s["comparisons_per_anchor"], config.seed)
    paths = export.export_world(w, qs, os.path.join(str(workdir), "world"))
    counts = collections.Counter(f"{q['split']}/{q['metadata']['type']}" for q in qs)
    _write_json(
        _path(workdir, "world", "stats.json"),
        {
            "passages": len(w.passages),
            "entities": len(w.entities),
            "questions": dict(sorted(counts.items())),
            "paths": paths,
        },
    )
    _log("world", f"{len(w.passages)} passages, {len(qs)} questions: {dict(sorted(counts.items()))}")


def load_questions(workdir, split: str) -> list[dict]:
    return export.read_jsonl(export.question_paths(os.path.join(str(workdir), "world"))[split])


def load_corpus(workdir) -> list[dict]:
    return export.read_jsonl(os.path.join(str(workdir), "world", "corpus.jsonl"))


# ------------------------------------------------------------------------------------------------ index
def make_retriever(config, workdir):
    """BM25 over the world's corpus, built in-process (sub-second for the synthetic corpus)."""
    from jaxrag.retrieval import Passage, build_bm25

    corpus = load_corpus(workdir)
    return build_bm25([Passage(r["id"], r["title"], r["contents"]) for r in corpus], backend=config.index.backend)


def index_stage(config, workdir) -> None:
    from jaxrag.retrieval import Passage, build_bm25

    corpus = load_corpus(workdir)
    retriever = build_bm25(
        [Passage(r["id"], r["title"], r["contents"]) for r in corpus],
        backend=config.index.backend,
        out_dir=_path(workdir, "index", "bm25"),
    )
    # Diagnostic: does the first good teacher query of each hop find its gold passage at k?
    qs = load_questions(workdir, "dev")
    hops = [h for q in qs for h in q["metadata"]["gold_chain"]]
    queries = [T.QUERY_TEMPLATES[h["relation"]][0].format(e=h["entity"]) for h in hops]
    k = config.index.k
    found = [h["passage_id"] in {x.doc_id for x in hits} for h, hits in zip(hops, retriever.search(queries, k))]
    stats = {
        "backend": config.index.backend,
        "k": k,
        "dev_hops": len(hops),
        "gold_recall_at_k_first_template": float(np.mean(found)) if found else 0.0,
    }
    _write_json(_path(workdir, "index", "stats.json"), stats)
    _log("index", json.dumps(stats))


# ------------------------------------------------------------------------------------------------ teacher
def teacher_config(config) -> T.TeacherConfig:
    s = settings(config, "teacher")
    return T.TeacherConfig(s["p_vague"], s["p_redundant"], s["p_premature"], s["max_retries"], s["max_steps"])


def teacher_stage(config, workdir) -> None:
    from jaxrag.env.mdp import write_episodes

    retriever = make_retriever(config, workdir)
    passages = {r["id"]: r for r in load_corpus(workdir)}
    entities = export.read_jsonl(os.path.join(str(workdir), "world", "entities.jsonl"))
    pool = T.guess_pool_from_entities([e for e in entities if not e["heldout"]])
    cfg = teacher_config(config)
    stats = {}
    for split in config.teacher.splits:
        qs = load_questions(workdir, split)
        t0 = time.perf_counter()
        trajs = T.run_teacher(qs, retriever, config.index.k, cfg, seed=config.seed, guess_pool=pool)
        eps = [sft_data.teacher_episode(q, s, passages) for q, s in zip(qs, trajs)]
        write_episodes(_path(workdir, "teacher", f"episodes_{split}.jsonl"), eps)
        flaws = collections.Counter(str(f) for e in eps for f in e.metadata["flaws"])
        stats[split] = {
            "episodes": len(eps),
            "em": float(np.mean([e.reward for e in eps])) if eps else 0.0,
            "mean_searches": float(np.mean([e.num_searches for e in eps])) if eps else 0.0,
            "actions": dict(flaws),
            "seconds": round(time.perf_counter() - t0, 2),
        }
        _log("teacher", f"{split}: {json.dumps(stats[split])}")
    _write_json(_path(workdir, "teacher", "stats.json"), stats)


def load_teacher_episodes(workdir, split: str):
    from jaxrag.env.mdp import read_episodes

    return read_episodes(os.path.join(str(workdir), "teacher", f"episodes_{split}.jsonl"))


# ------------------------------------------------------------------------------------------------ tokenizer
def _sft_agents(config) -> list[str]:
    return [config[n].agent for n in config.stages if n in config and "agent" in config[n] and "sft" in n]


def tokenizer_stage(config, workdir) -> None:
    """sentencepiece on the non-held-out passages, the train questions and the train SFT texts of every agent."""
    from jaxrag.env.agents import get_agent

    s = settings(config, "tokenizer")
    metas = export.read_jsonl(os.path.join(str(workdir), "world", "passages_meta.jsonl"))
    entities = {e["id"]: e for e in export.read_jsonl(os.path.join(str(workdir), "world", "entities.jsonl"))}
    texts = [f"{m['title']}: {m['contents']}" for m in metas if not entities[m["subject"]]["heldout"]]
    episodes = load_teacher_episodes(workdir, "train")
    for name in _sft_agents(config):
        agent = get_agent(name, mode="plain")
        for ep in episodes:
            pairs = sft_data.step_pairs(ep, agent)
            texts.append(pairs[-1][0] + pairs[-1][1])
    from jaxrag.data.synthetic.spm import train_sentencepiece

    path = train_sentencepiece(texts, _path(workdir, "tokenizer", "spm.model"), s["vocab_size"])
    _log("tokenizer", f"{path} from {len(texts)} texts")


def tokenizer_path(workdir) -> str:
    return os.path.join(str(workdir), "tokenizer", "spm.model")


# ------------------------------------------------------------------------------------------------ sft
def _model_config(config, tok):
    from jaxrag.models import ModelConfig

    m = settings(config, "model")
    return ModelConfig(
        model_type="llama",
        vocab_size=tok.vocab_size,
        d_model=m["d_model"],
        n_layers=m["n_layers"],
        n_heads=m["n_heads"],
        n_kv_heads=m["n_kv_heads"],
        head_dim=m["head_dim"],
        d_ff=m["d_ff"],
        rope_theta=m["rope_theta"],
        max_seq_len=m["max_seq_len"],
        tie_embeddings=m["tie_embeddings"],
        bos_id=tok.bos_id,
        eos_ids=tuple(tok.eos_ids),
        pad_id=tok.pad_id,
    )


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


def sft_stage(config, workdir, name: str = "sft") -> None:
    """SFT of a fresh (or `init_from`) policy on the teacher's train trajectories in `agent`'s format."""
    import jax
    from jaxrag.data.synthetic.params_io import load_model, save_model
    from jaxrag.data.synthetic.sft_train import train_sft
    from jaxrag.env.agents import get_agent
    from jaxrag.models import init_params
    from jaxrag.tokenizer import load_tokenizer

    s = settings(config, name)
    tok = load_tokenizer(tokenizer_path(workdir))
    agent = get_agent(s["agent"], mode="plain")
    train_eps = load_teacher_episodes(workdir, "train")
    if s["only_correct"]:
        train_eps = [e for e in train_eps if e.reward > 0]
    train, train_info = sft_arrays(train_eps, agent, tok, s["max_len"], pack=s.get("pack", True))
    evals = {}
    for split in ("dev", "heldout"):
        if split in config.teacher.splits:  # teacher-forced curves on the teacher's own (correct) trajectories
            eps = [e for e in load_teacher_episodes(workdir, split) if e.reward > 0]
            evals[split], _ = sft_arrays(eps, agent, tok, s["max_len"], s["eval_max_sequences"])
    if s["init_from"]:
        mcfg, params = load_model(os.path.join(str(workdir), s["init_from"]))
    else:
        mcfg = _model_config(config, tok)
        params = init_params(mcfg, jax.random.PRNGKey(config.seed))
    n_params = int(sum(np.size(x) for x in jax.tree.leaves(params)))
    _log(name, f"agent={s['agent']} params={n_params} train={train_info} budget={s['time_budget_s']}s")
    params, history = train_sft(
        mcfg,
        params,
        train,
        evals,
        lr=s["lr"],
        batch_size=s["batch_size"],
        time_budget_s=s["time_budget_s"],
        max_steps=s["max_steps"],
        warmup_steps=s["warmup_steps"],
        eval_every_s=s["eval_every_s"],
        seed=config.seed,
        metrics_path=_path(workdir, name, "metrics.jsonl"),
    )
    save_model(os.path.join(str(workdir), name), mcfg, params)
    last = {h["split"]: h for h in history if h["kind"] == "eval"}
    summary = {
        "agent": s["agent"],
        "params": n_params,
        "train": train_info,
        "steps": max((h["step"] for h in history), default=0),
        "train_seconds": max((h["time_s"] for h in history), default=0.0),
        "final_teacher_forced": last,
    }
    _write_json(_path(workdir, name, "summary.json"), summary)
    _log(name, json.dumps(summary))


def sft_re2search_stage(config, workdir) -> None:
    sft_stage(config, workdir, "sft_re2search")


# ------------------------------------------------------------------------------------------------ eval
FORCED_ANSWER_AGENTS = ("direct", "rag")  # baselines: the same model, made to answer (see forced.py)


def parse_system(spec: str) -> tuple[str, str, str]:
    """ "name:agent:model_stage" -> (name, agent, model_stage)."""
    parts = spec.split(":")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"config.eval.systems entry {spec!r} must be 'name:agent:model_stage'")
    return parts[0], parts[1], parts[2]


def score_episodes(episodes, questions: dict[str, dict]) -> dict:
    """EM/F1 per question type and hop count, search-count stats, SE, invalid rate."""
    from jaxrag.metrics import exact_match, f1_score, invalid_rate, search_count_stats, search_efficiency

    rows = []
    for ep in episodes:
        q = questions[ep.qid]
        rows.append(
            {
                "type": q["metadata"]["type"],
                "hops": q["metadata"]["hops"],
                "em": exact_match(ep.answer, ep.gold),
                "f1": f1_score(ep.answer, ep.gold),
                "searches": ep.num_searches,
                "invalid": ep.num_invalid,
                "steps": len(ep.steps),
            }
        )

    def agg(rs):
        return {
            "n": len(rs),
            "em": float(np.mean([r["em"] for r in rs])) if rs else 0.0,
            "f1": float(np.mean([r["f1"] for r in rs])) if rs else 0.0,
            "se": search_efficiency([r["f1"] for r in rs], [r["searches"] for r in rs]),
            "searches": search_count_stats([r["searches"] for r in rs]),
            "invalid_rate": invalid_rate([r["invalid"] for r in rs], [r["steps"] for r in rs]),
        }

    out = {"all": agg(rows), "by_type": {}, "by_hops": {}}
    for t in sorted({r["type"] for r in rows}):
        out["by_type"][t] = agg([r for r in rows if r["type"] == t])
    for h in sorted({r["hops"] for r in rows}):
        out["by_hops"][str(h)] = agg([r for r in rows if r["hops"] == h])
    return out


def stratified(questions: list[dict], limit: int) -> list[dict]:
    """At most `limit` questions, split evenly over question types (in file order within a type); 0 = all."""
    if not limit:
        return questions
    by_type = collections.defaultdict(list)
    for q in questions:
        by_type[q["metadata"]["type"]].append(q)
    per_type = -(-limit // len(by_type))
    keep = {q["id"] for qs in by_type.values() for q in qs[:per_type]}
    return [q for q in questions if q["id"] in keep]


def eval_stage(config, workdir) -> None:
    from jaxrag.data.synthetic.forced import ForcedAnswerPolicy
    from jaxrag.data.synthetic.params_io import load_model
    from jaxrag.env.agents import get_agent
    from jaxrag.env.mdp import write_episodes
    from jaxrag.env.rollout import RolloutConfig, rollout
    from jaxrag.policy import JaxPolicy
    from jaxrag.tokenizer import load_tokenizer

    s = settings(config, "eval")
    tok = load_tokenizer(tokenizer_path(workdir))
    retriever = make_retriever(config, workdir)
    models = {}
    results = {"seed": config.seed, "k": config.index.k, "systems": {}}
    for spec in s["systems"]:
        sysname, agent_name, model_stage = parse_system(spec)
        if model_stage not in models:
            mcfg, params = load_model(os.path.join(str(workdir), model_stage))
            models[model_stage] = JaxPolicy(mcfg, params, tok)
        agent = get_agent(agent_name, mode="plain")
        policy = models[model_stage]
        if agent_name in FORCED_ANSWER_AGENTS:
            policy = ForcedAnswerPolicy(policy)
        rcfg = RolloutConfig(
            k=config.index.k,
            max_steps=s["max_steps"],
            batch_size=s["batch_size"],
            max_new_tokens=s["max_new_tokens"],
            reward="em",
            seed=config.seed,
            progress=True,
        )
        results["systems"][sysname] = {"agent": agent_name, "model": model_stage, "splits": {}}
        for split in s["splits"]:
            qs = stratified(load_questions(workdir, split), s["max_questions"])
            t0 = time.perf_counter()
            stats: dict = {}
            episodes = rollout(policy, retriever, agent, qs, rcfg, stats=stats)
            write_episodes(_path(workdir, "eval", f"episodes_{sysname}_{split}.jsonl"), episodes)
            scored = score_episodes(episodes, {q["id"]: q for q in qs})
            scored["seconds"] = round(time.perf_counter() - t0, 2)
            results["systems"][sysname]["splits"][split] = scored
            _log(
                "eval",
                f"{sysname} {split}: EM {scored['all']['em']:.3f} "
                f"(2hop {scored['by_type'].get('2hop', {}).get('em', 0):.3f}) "
                f"searches {scored['all']['searches']['mean']:.2f} invalid {scored['all']['invalid_rate']:.3f} "
                f"in {scored['seconds']}s",
            )
    _write_json(_path(workdir, "eval", "results.json"), results)


# ------------------------------------------------------------------------------------------------ report
def report_stage(config, workdir) -> None:
    from jaxrag import report

    results = json.load(open(os.path.join(str(workdir), "eval", "results.json")))
    curves = {}
    for name in config.stages:
        p = os.path.join(str(workdir), name, "metrics.jsonl")
        if os.path.exists(p):
            curves[name] = export.read_jsonl(p)
    out = os.path.join(str(workdir), "report")
    files = report.write_report(
        results,
        curves,
        out,
        title=f"Synthetic multi-hop world (seed {config.seed}, scale {config.get('scale', 'demo')})",
    )
    _log("report", ", ".join(files))
