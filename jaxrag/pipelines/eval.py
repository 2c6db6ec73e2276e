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
EM how much of the gold the index holds and finds: evaluate.index_recall). 
An agent entry may carry a critic (PRM-guided best-of-N, RAG-Gym Alg. 1 / 001 App. E.3: N = 10 candidates at T = 1.0,
execute argmax_a r_φ(s, a)): `critic` (a critic checkpoint: a dir, absolute or relative to the workdir, or
"stage:<name>", holding a HF model + head.npz as pipelines/common.save_checkpoint writes and its own tokenizer, so the
critic may be another model family: it scores text rendered with its own chat template; or {fn: "module:function"}:
fn(section, workdir, agent) -> a rollout `select`, e.g. a scripted one in tests; optional batch_size, valid_only), `n`
(candidates per step, default 10), `temperature` (default 1.0), `critic_tag` (default "critic"; "orm" for an outcome
reward model) and `variant` (a "-<variant>" suffix: "re2search+critic-llama", "re2search+critic-n4"). The method is
"<method>[+<tuning>]+<critic_tag>[-<variant>]" (published.METHODS: "re2search+dpo+critic", Table 4's rows). Writes
`workdir/<name>/{method}__{dataset}.episodes.jsonl`, `metrics.jsonl` (with the episodes' answer_recall / gold_recall
and the index's index_*), `index_recall.json`, `table.md`, `table.csv`.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np

from jaxrag.data.qa import QADataError, load_qa, parse_select
from jaxrag.env.agents import agent_module, get_agent
from jaxrag.env.rollout import RolloutConfig
from jaxrag.env.mdp import write_episodes
from jaxrag.evaluate import episode_metrics, evaluate, index_recall, recall_table, results_table
from jaxrag.judge import judge_from_config
from jaxrag.metrics import title_key
from jaxrag.paths import BENCHMARKS
from jaxrag.pipelines.common import config_fail, load_agent, load_checkpoint, plain, resolve, write_json
from jaxrag.retrieval import iter_corpus
from jaxrag.stage_fn import resolve_fn
from jaxrag.supervision.critic import CriticScorer, critic_select
from jaxrag.tokenizer import load_tokenizer
from jaxrag.train.distributed import allgather_objects, barrier, gather_shares, is_lead, process_count, \
    process_index, share


log = logging.getLogger(__name__)
_LOAD_POLICY = "jaxrag.pipelines.common:load_policy"


def _check_file(key: str, path: str) -> None:
    p = Path(path)
    if not p.is_file():
        if str(p).startswith(str(BENCHMARKS)) and not BENCHMARKS.is_dir():
            config_fail(key, f"{p}: no such file (JAXRAG_BENCHMARKS={BENCHMARKS}: no such directory)")
        config_fail(key, f"{p}: no such file")
    if p.stat().st_size == 0:
        config_fail(key, f"{p}: empty file")


def agent_entries(ec) -> list[dict]:
    """The stage's agent entries as dicts (a bare name is {"name": name})."""
    return [{"name": a} if isinstance(a, str) else dict(a) for a in plain(ec.agents)]


def method_name(a: dict, tuning: str = "") -> str:
    """An agent entry's method: "<method>[+<tuning>][+<critic_tag>][-<variant>]" (see the module doc)."""
    m = a.get("method", a["name"]) + (f"+{tuning}" if tuning else "")
    if a.get("critic"):
        m += "+" + (a.get("critic_tag") or "critic")
    return m + (f"-{a['variant']}" if a.get("variant") else "")


def _critic_dir(spec) -> str:
    return spec if isinstance(spec, str) else (spec.get("path") or "")


def _check_critic(config, name: str, i: int, a: dict) -> None:
    """A critic entry's keys: n >= 1, temperature >= 0, and a critic that exists (an absolute dir now; "stage:<s>" an
    earlier stage; a relative dir when the stage starts: `load_critic`)."""
    where = f"{name}.agents[{i}]"
    n = a.get("n", 10)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        config_fail(f"{where}.n", f"{n!r}: candidates per step must be an int >= 1")
    t = a.get("temperature", 1.0)
    if not isinstance(t, (int, float)) or t < 0:
        config_fail(f"{where}.temperature", f"{t!r}: must be a number >= 0")
    spec = a["critic"]
    if isinstance(spec, dict) and spec.get("fn"):
        return
    path = _critic_dir(spec)
    if not path:
        config_fail(f"{where}.critic", "empty: a critic checkpoint dir (HF model + head.npz) or stage:<name>")
    if path.startswith("stage:"):
        stage = path.split(":", 1)[1]
        stages = list(config.get("stages", []))
        if stage not in stages or (name in stages and stages.index(stage) > stages.index(name)):
            config_fail(f"{where}.critic", f"{path!r}: no stage '{stage}' runs before '{name}'")
    elif Path(path).is_absolute():
        _check_critic_dir(f"{where}.critic", Path(path))


def _check_critic_dir(key: str, p: Path) -> None:
    if not (p / "config.json").is_file():
        config_fail(key, f"{p}: no critic checkpoint here (no config.json)")
    if not (p / "head.npz").is_file():
        config_fail(key, f"{p}: no head.npz (a policy checkpoint, not a critic?)")


def _critic_checkpoint(path: str, key: str, workdir):
    """(model config, params, head, tokenizer) of the critic checkpoint at `path` (relative to the workdir, or
    stage:<name>); a dir that is not a critic checkpoint is an error naming `key`."""
    path = resolve(path, workdir)
    try:
        _check_critic_dir(key, path)
    except ValueError as e:
        raise ValueError(f"{e} (has its stage run?)") from None
    mcfg, params, head = load_checkpoint(path, with_head=True)
    return mcfg, params, head, load_tokenizer(path)


def load_critic(spec, key: str, workdir, agent_name: str, agent_opts: dict):
    """The rollout `select` of a critic entry: CriticScorer over the checkpoint (its own tokenizer renders the
    states with the same agent design) -> argmax_a r_φ(s, a) (jaxrag.supervision.critic.critic_select)."""
    spec = {"path": spec} if isinstance(spec, str) else dict(spec)
    if spec.get("fn"):
        return resolve_fn(spec["fn"], f"{key}.fn")(spec, workdir, agent_name)
    mcfg, params, head, tok = _critic_checkpoint(spec["path"], key, workdir)
    opts = dict(agent_opts)
    if opts.get("mode", "chat") == "chat":
        opts["tokenizer"] = tok  # the critic's own chat template renders its view of the state
    scorer = CriticScorer(mcfg, params, head, tok, get_agent(agent_name, **opts),
                          batch_size=spec.get("batch_size", 32))
    return critic_select(scorer, valid_only=bool(spec.get("valid_only", False)))


def load_prm(spec, key: str, workdir, agent_section):
    """PPO's process rewards (RAG-Gym §2.3: "PPO then optimizes the agent to maximize the process reward of newly
    generated actions"): episodes -> per-step rewards r_φ(s_t, a_t) from a critic checkpoint, each state rendered
    by the agent design in the critic's own chat template, one batched pass over every step of every episode.
    agent_section: the rl stage's agent section (name, mode, max_docs, max_doc_chars)."""
    mcfg, params, head, tok = _critic_checkpoint(_critic_dir(spec), key, workdir)
    scorer = CriticScorer(mcfg, params, head, tok, load_agent(agent_section, tok))

    def step_rewards(episodes) -> list[list[float]]:
        states = [ep.state(s) for ep in episodes for s in range(len(ep.steps))]
        texts = [[st.action.raw] for ep in episodes for st in ep.steps]
        flat = [float(x[0]) for x in scorer.score_states(states, texts)] if states else []
        out, i = [], 0
        for ep in episodes:
            out.append(flat[i:i + len(ep.steps)])
            i += len(ep.steps)
        return out

    return step_rewards


def random_critic(spec, workdir, agent_name: str):
    """RAG-Gym Table 4's "PRM (Random)": a `select` that executes one of the N candidates uniformly at random
    (seeded by spec["seed"], default 0); use as an agent entry's critic: {"fn": "jaxrag.pipelines.eval:random_critic"}."""
    rng = np.random.default_rng(int(spec.get("seed", 0)))
    return lambda states, cands: [int(rng.integers(len(cs))) for cs in cands]


def check_config(config, name: str) -> None:
    """Static checks run by jaxrag.main before any stage starts: agent names, unique methods, dataset files that
    exist and are not empty, their select specs, the rollout fields, the default loaders' paths."""
    ec = config[name]
    for key in ("agents", "datasets", "policy", "retriever"):
        if key not in ec:
            config_fail(f"{name}.{key}", "missing")
    methods = set()
    for i, a in enumerate(agent_entries(ec)):
        try:
            agent_module(a.get("name") or "")
        except KeyError as e:
            config_fail(f"{name}.agents[{i}].name", e.args[0])
        if a.get("critic") is not None:
            _check_critic(config, name, i, a)
        else:
            for key in ("n", "temperature", "critic_tag"):
                if key in a:
                    config_fail(f"{name}.agents[{i}].{key}", f"only with a critic (set agents[{i}].critic)")
        method = method_name(a)
        if method in methods:
            config_fail(f"{name}.agents[{i}]", f"duplicate method name {method!r} (give one a 'method')")
        methods.add(method)
    for j, d in enumerate(plain(ec.datasets)):
        if not d.get("path"):
            config_fail(f"{name}.datasets[{j}].path", "missing")
        if Path(d["path"]).is_absolute():  # relative ones are relative to the workdir: checked when the stage starts
            _check_file(f"{name}.datasets[{j}].path", d["path"])
        try:
            parse_select(d.get("select"), 1)
        except QADataError as e:
            config_fail(f"{name}.datasets[{j}].select", str(e))
    try:
        RolloutConfig(**plain(ec.get("rollout", {})))
    except TypeError as e:
        config_fail(f"{name}.rollout", str(e))
    pcfg, rcfg = plain(ec.policy), plain(ec.retriever)
    if pcfg.get("fn", "jaxrag.pipelines.common:load_policy") == "jaxrag.pipelines.common:load_policy" \
            and not pcfg.get("path"):
        config_fail(f"{name}.policy.path", f"empty: set --config.{name}.policy.path=<a Hugging Face checkpoint dir>")
    if rcfg.get("fn", "jaxrag.pipelines.common:load_retriever") == "jaxrag.pipelines.common:load_retriever" \
            and not rcfg.get("index_dir") and rcfg.get("corpus"):
        _check_file(f"{name}.retriever.corpus", rcfg["corpus"])
    try:
        judge_from_config(plain(ec.get("judge", None)))
    except ValueError as e:
        config_fail(f"{name}.judge", str(e))


def corpus_titles(rcfg: dict, workdir) -> set[str] | None:
    """The title keys (metrics.title_key) of the retriever's corpus, streamed: `index_dir`/corpus.jsonl or `corpus`
    (its first `max_passages`); None for a custom retriever `fn` or a corpus without titles."""
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
    ec = config[name]
    datasets = [dict(d, path=str(resolve(d["path"], workdir))) for d in plain(ec.datasets)]
    for j, d in enumerate(datasets):
        _check_file(f"{name}.datasets[{j}].path", d["path"])
    out_dir = Path(workdir) / name
    out_dir.mkdir(parents=True, exist_ok=True)
    pcfg, rcfg = plain(ec.policy), plain(ec.retriever)
    policy = resolve_fn(pcfg.get("fn", "jaxrag.pipelines.common:load_policy"), f"config.{name}.policy.fn")(pcfg, workdir)
    retriever = resolve_fn(rcfg.get("fn", "jaxrag.pipelines.common:load_retriever"), f"config.{name}.retriever.fn")(rcfg, workdir)
    scfg = plain(ec.get("summarizer", None))
    if scfg and scfg.get("fn", _LOAD_POLICY) == _LOAD_POLICY and not scfg.get("path"):
        scfg = None  # an empty path: the policy summarizes
    summarizer = (resolve_fn(scfg.get("fn", "jaxrag.pipelines.common:load_policy"), f"config.{name}.summarizer.fn")
                  (scfg, workdir) if scfg else None)
    judge = judge_from_config(plain(ec.get("judge", None)))
    rc = RolloutConfig(**plain(ec.get("rollout", {})))
    results: dict[str, dict[str, dict]] = {}
    metrics_path = out_dir / "metrics.jsonl"
    lead = is_lead()
    if lead:
        metrics_path.write_text("")
    # The index's own recall per dataset (the question as the query, no policy): beside EM in table.md
    examples = {d.get("name", Path(d["path"]).stem): load_qa(d["path"], d.get("select"), limit=d.get("limit"))
                for d in datasets}  # read once: every agent and the index recall use the same questions
    recall: dict[str, dict] = {}
    if ec.get("index_recall", True) and lead:
        titles = corpus_titles(rcfg, workdir)
        recall = {dname: index_recall(retriever, exs, rc.k, titles) for dname, exs in examples.items()}
        write_json(out_dir / "index_recall.json", recall)
    entries = agent_entries(ec)
    selects = {}  # every critic loads before any rollout: a missing one fails before compute
    for i, a in enumerate(entries):
        if a.get("critic") is not None:
            opts = dict(a.get("opts", {}))
            opts.pop("tokenizer", None)
            if "max_doc_chars" in ec:
                opts.setdefault("max_doc_chars", ec.max_doc_chars)
            selects[i] = load_critic(a["critic"], f"config.{name}.agents[{i}].critic", workdir, a["name"], opts)
    for i, a in enumerate(entries):
        opts = dict(a.get("opts", {}))
        if opts.get("mode", "chat") == "chat" and "tokenizer" not in opts:
            opts["tokenizer"] = getattr(policy, "tokenizer", None)
        if "max_doc_chars" in ec:
            opts.setdefault("max_doc_chars", ec.max_doc_chars)
        agent = get_agent(a["name"], **opts)
        method = method_name(a, ec.get("tuning") or "")
        arc = rc
        if i in selects:  # best-of-N: N candidates per state at the sampling temperature, the critic's argmax runs
            arc = dataclasses.replace(rc, n_candidates=a.get("n", 10), temperature=float(a.get("temperature", 1.0)))
        for dname, exs in examples.items():
            log.info("eval %s on %s (%d questions)", method, dname, len(exs))
            m = _evaluate(policy, retriever, agent, exs, arc, judge, summarizer, selects.get(i),
                          out_dir / f"{method}__{dname}.episodes.jsonl")
            if not lead:
                continue
            if i in selects:
                m.update(n_candidates=arc.n_candidates, temperature=arc.temperature)
            if dname in recall:
                m.update({f"index_{key}": v for key, v in recall[dname].items() if key not in ("k", "n")})
            results.setdefault(method, {})[dname] = m
            with metrics_path.open("a") as f:
                f.write(json.dumps({"method": method, "dataset": dname, **m}) + "\n")
    if lead:
        md, csv_text = results_table(results)
        if recall:
            md += ("\nRetrieval, with no policy in the loop (each question itself as the query): how much of the gold "
                   "the index holds and finds. A low value is a retrieval gap, not a policy gap.\n\n"
                   + recall_table(recall))
        (out_dir / "table.md").write_text(md)
        (out_dir / "table.csv").write_text(csv_text)
    barrier(f"eval:{out_dir}")
    return results


SEED_STRIDE = 1_000_003  # multi-host eval: process p samples with seed + p * SEED_STRIDE (its own row keys)


def _evaluate(policy, retriever, agent, exs, rc: RolloutConfig, judge, summarizer, select, out_path: Path) -> dict:
    """evaluate() on one process; on several, each rolls out its contiguous share of the questions (`share`) with
    its own sampler, the episodes are gathered in question order, and process 0 judges, scores and writes them
    (the metrics and the file are those of one process's run over the same questions: exactly so at temperature 0;
    at T > 0 each process's rows draw from keys of their own). Returns the metrics (process 0) or {}."""
    if process_count() == 1:
        return evaluate(policy, retriever, agent, exs, cfg=rc, judge=judge, summarizer=summarizer, select=select,
                        out_path=out_path)[1]
    mine = share(exs)
    rc = dataclasses.replace(rc, seed=rc.seed + process_index() * SEED_STRIDE)
    eps, m = evaluate(policy, retriever, agent, mine, cfg=rc, summarizer=summarizer, select=select) if mine \
        else ([], {"timing": {}})
    episodes = gather_shares(eps)
    timings = allgather_objects(m["timing"])
    if not is_lead():
        return {}
    out = episode_metrics(episodes, judge=judge, answer_of=getattr(agent, "scored_answer", None))
    timing: dict = {}
    for t in timings:  # the processes ran side by side: seconds are the slowest's, counts add up
        for k, v in t.items():
            if isinstance(v, (int, float)):
                timing[k] = max(timing.get(k, 0), v) if k.endswith("_s") else timing.get(k, 0) + v
    out["timing"] = timing
    if timing.get("total_s"):
        out["episodes_per_s"] = len(episodes) / timing["total_s"]
    out["processes"] = process_count()
    write_episodes(out_path, episodes)
    return out


eval_stage.check_config = check_config
