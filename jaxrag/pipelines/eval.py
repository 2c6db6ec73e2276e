"""The evaluation stage of the paper configs (configs/<paper>/<table>.py): agents x datasets -> episodes, metrics, tables.

config[name]: agents (names or {name, method, opts}), datasets ({name, path, select, limit}), policy ({fn, path,
tokenizer, ...}), retriever ({fn, index_dir | corpus, ...}), rollout (RolloutConfig fields), judge; dataset, policy
and index paths are absolute or relative to the workdir. Optional:
summarizer (a policy spec like `policy`: the model that writes Search-o1 / Re²Search summaries and ReasonRAG
evidence, e.g. the untuned base model as in RAG-Gym; absent, None or an empty path: the policy; it must share the policy's
tokenizer, whose chat template renders its prompts) and max_doc_chars (every agent's per-document character cut
unless its own opts set one; None: no cut, the papers' setting; absent: the agents' default, 1,000), tuning (e.g.
"dpo": every method is named "<method>+dpo", a tuned row of the paper's table), index_recall
(default True: each dataset's questions are also searched as they are, with no policy, and table.md reports beside
EM how much of the gold the index holds and finds: evaluate.index_recall). Writes
`workdir/<name>/{method}__{dataset}.episodes.jsonl`, `metrics.jsonl` (with the episodes' answer_recall / gold_recall
and the index's index_*), `index_recall.json`, `table.md`, `table.csv`.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from jaxrag.env.agents import get_agent
from jaxrag.env.rollout import RolloutConfig
from jaxrag.evaluate import evaluate, results_table
from jaxrag.judge import judge_from_config
from jaxrag.pipelines.common import config_fail, write_json


log = logging.getLogger(__name__)
_LOAD_POLICY = "jaxrag.pipelines.common:load_policy"


def _plain(v):
    return v.to_dict() if hasattr(v, "to_dict") else v


def _check_file(key: str, path: str) -> None:
    from jaxrag.paths import BENCHMARKS

    p = Path(path)
    if not p.is_file():
        if str(p).startswith(str(BENCHMARKS)) and not BENCHMARKS.is_dir():
            config_fail(key, f"{p}: no such file (JAXRAG_BENCHMARKS={BENCHMARKS}: no such directory)")
        config_fail(key, f"{p}: no such file")
    if p.stat().st_size == 0:
        config_fail(key, f"{p}: empty file")


def check_config(config, name: str) -> None:
    """Static checks run by jaxrag.main before any stage starts: agent names, unique methods, dataset files that
    exist and are not empty, their select specs, the rollout fields, the default loaders' paths."""
    from jaxrag.data.qa import QADataError, parse_select
    from jaxrag.env.agents import agent_module

    ec = config[name]
    for key in ("agents", "datasets", "policy", "retriever"):
        if key not in ec:
            config_fail(f"{name}.{key}", "missing")
    methods = set()
    for i, a in enumerate(_plain(ec.agents)):
        a = {"name": a} if isinstance(a, str) else dict(a)
        try:
            agent_module(a.get("name") or "")
        except KeyError as e:
            config_fail(f"{name}.agents[{i}].name", e.args[0])
        method = a.get("method", a["name"])
        if method in methods:
            config_fail(f"{name}.agents[{i}]", f"duplicate method name {method!r} (give one a 'method')")
        methods.add(method)
    for j, d in enumerate(_plain(ec.datasets)):
        if not d.get("path"):
            config_fail(f"{name}.datasets[{j}].path", "missing")
        if Path(d["path"]).is_absolute():  # relative ones are relative to the workdir: checked when the stage starts
            _check_file(f"{name}.datasets[{j}].path", d["path"])
        try:
            parse_select(d.get("select"), 1)
        except QADataError as e:
            config_fail(f"{name}.datasets[{j}].select", str(e))
    try:
        RolloutConfig(**_plain(ec.get("rollout", {})))
    except TypeError as e:
        config_fail(f"{name}.rollout", str(e))
    pcfg, rcfg = _plain(ec.policy), _plain(ec.retriever)
    if pcfg.get("fn", "jaxrag.pipelines.common:load_policy") == "jaxrag.pipelines.common:load_policy" \
            and not pcfg.get("path"):
        config_fail(f"{name}.policy.path", "empty: set --config.{name}.policy.path=<a Hugging Face checkpoint dir>")
    if rcfg.get("fn", "jaxrag.pipelines.common:load_retriever") == "jaxrag.pipelines.common:load_retriever" \
            and not rcfg.get("index_dir") and rcfg.get("corpus"):
        _check_file(f"{name}.retriever.corpus", rcfg["corpus"])
    try:
        judge_from_config(_plain(ec.get("judge", None)))
    except ValueError as e:
        config_fail(f"{name}.judge", str(e))


def corpus_titles(rcfg: dict, workdir) -> set[str] | None:
    """The title keys (metrics.title_key) of the retriever's corpus, streamed: `index_dir`/corpus.jsonl or `corpus`
    (its first `max_passages`); None for a custom retriever `fn` or a corpus without titles."""
    from jaxrag.metrics import title_key
    from jaxrag.pipelines.common import resolve
    from jaxrag.retrieval import iter_corpus

    if rcfg.get("fn", "jaxrag.pipelines.common:load_retriever") != "jaxrag.pipelines.common:load_retriever":
        return None
    if rcfg.get("index_dir"):
        path, limit = resolve(rcfg["index_dir"], workdir) / "corpus.jsonl", None
    elif rcfg.get("corpus"):
        path, limit = resolve(rcfg["corpus"], workdir), rcfg.get("max_passages") or None
    else:
        return None
    titles = set()
    for i, p in enumerate(iter_corpus(path)):
        if limit is not None and i >= limit:
            break
        if p.title:
            titles.add(title_key(p.title))
    return titles or None


def eval_stage(config, workdir: str | Path, name: str) -> dict:
    """For every (agent, dataset) in config[name]: episodes JSONL + metrics + tables under workdir/<name>/."""
    from jaxrag.data.qa import load_qa
    from jaxrag.evaluate import index_recall, recall_table
    from jaxrag.main import resolve_fn
    from jaxrag.pipelines.common import resolve

    ec = config[name]
    datasets = [dict(d, path=str(resolve(d["path"], workdir))) for d in _plain(ec.datasets)]
    for j, d in enumerate(datasets):
        _check_file(f"{name}.datasets[{j}].path", d["path"])
    out_dir = Path(workdir) / name
    out_dir.mkdir(parents=True, exist_ok=True)
    pcfg, rcfg = _plain(ec.policy), _plain(ec.retriever)
    policy = resolve_fn(pcfg.get("fn", "jaxrag.pipelines.common:load_policy"), f"config.{name}.policy.fn")(pcfg, workdir)
    retriever = resolve_fn(rcfg.get("fn", "jaxrag.pipelines.common:load_retriever"), f"config.{name}.retriever.fn")(rcfg, workdir)
    scfg = _plain(ec.get("summarizer", None))
    if scfg and scfg.get("fn", _LOAD_POLICY) == _LOAD_POLICY and not scfg.get("path"):
        scfg = None  # an empty path: the policy summarizes
    summarizer = (resolve_fn(scfg.get("fn", "jaxrag.pipelines.common:load_policy"), f"config.{name}.summarizer.fn")
                  (scfg, workdir) if scfg else None)
    judge = judge_from_config(_plain(ec.get("judge", None)))
    rc = RolloutConfig(**_plain(ec.get("rollout", {})))
    results: dict[str, dict[str, dict]] = {}
    metrics_path = out_dir / "metrics.jsonl"
    metrics_path.write_text("")
    # The index's own recall per dataset (the question as the query, no policy): beside EM in table.md
    examples = {d.get("name", Path(d["path"]).stem): load_qa(d["path"], d.get("select"), limit=d.get("limit"))
                for d in datasets}  # read once: every agent and the index recall use the same questions
    recall: dict[str, dict] = {}
    if ec.get("index_recall", True):
        titles = corpus_titles(rcfg, workdir)
        recall = {dname: index_recall(retriever, exs, rc.k, titles) for dname, exs in examples.items()}
        write_json(out_dir / "index_recall.json", recall)
    for a in _plain(ec.agents):
        a = {"name": a} if isinstance(a, str) else dict(a)
        opts = dict(a.get("opts", {}))
        if opts.get("mode", "chat") == "chat" and "tokenizer" not in opts:
            opts["tokenizer"] = getattr(policy, "tokenizer", None)
        if "max_doc_chars" in ec:
            opts.setdefault("max_doc_chars", ec.max_doc_chars)
        agent = get_agent(a["name"], **opts)
        method = a.get("method", a["name"]) + (f"+{ec.tuning}" if ec.get("tuning") else "")
        for dname, exs in examples.items():
            log.info("eval %s on %s (%d questions)", method, dname, len(exs))
            _, m = evaluate(policy, retriever, agent, exs, cfg=rc, judge=judge, summarizer=summarizer,
                            out_path=out_dir / f"{method}__{dname}.episodes.jsonl")
            if dname in recall:
                m.update({f"index_{key}": v for key, v in recall[dname].items() if key not in ("k", "n")})
            results.setdefault(method, {})[dname] = m
            with metrics_path.open("a") as f:
                f.write(json.dumps({"method": method, "dataset": dname, **m}) + "\n")
    md, csv_text = results_table(results)
    if recall:
        md += ("\nRetrieval, with no policy in the loop (each question itself as the query): how much of the gold "
               "the index holds and finds. A low value is a retrieval gap, not a policy gap.\n\n" + recall_table(recall))
    (out_dir / "table.md").write_text(md)
    (out_dir / "table.csv").write_text(csv_text)
    return results


eval_stage.check_config = check_config
