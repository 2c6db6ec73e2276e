"""The credit audit stage: every step-credit signal of the project scored against replayed causal credit in the
synthetic world (jaxrag.supervision.credit_audit; how to read it: docs/credit_audit.md).

config[name]: policy (the stage whose model is audited), critic (a critic stage, or "" for none), agent, split,
max_questions (stratified by question type), states (audit states kept, stratified by question type, hops, step
and state kind), n_candidates and temperature (the policy's own samples per state, the supervision stage's T),
teacher / oracle (add the teacher's and the oracle's action at each state), m and replay_temperature (the replay's
continuations), max_steps, max_new_tokens, batch_size, signals, z, bootstrap. The rollout-value signal takes the
supervision section's settings (config[rollout_from]: rollout_m, temperature; its seed, as that stage draws it); the
mcts signal the mcts stage's (`mcts`: search, temperature, max_new_tokens, batch_size; the run's seed) and the
audit's budget `mcts_rollouts` (simulations per distinct candidate).
Outputs under workdir/<name>/: results.json, results.md, credit_audit.png, records_replay.jsonl (the states, their
candidates and every continuation's EM and F1), signals.jsonl (each signal's value per candidate).
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np

from jaxrag.console import num
from jaxrag.data.synthetic import teacher as T
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import Action
from jaxrag.jsonl import read_jsonl, write_jsonl
from jaxrag.pipelines.common import config_fail, log, stage_dir, write_json
from jaxrag.pipelines.synthetic import checks
from jaxrag.pipelines.synthetic.evaluate import stratified
from jaxrag.pipelines.synthetic.preference import critic_scorer
from jaxrag.pipelines.synthetic.report import plt, save_figure
from jaxrag.pipelines.synthetic.world import (load_questions, load_tokenizer, make_retriever, rollout_config,
                                             stage_policy, teacher_config, world_seed)
from jaxrag.supervision import credit_audit as CA
from jaxrag.supervision.credit_audit import AuditContext, MCTSSignalConfig, get_signal, state_kind
from jaxrag.supervision.judges import LocalJudge, get_judge
from jaxrag.supervision.mcts import MCTSConfig
from jaxrag.supervision.records import ScoredCandidate, write_records
from jaxrag.supervision.rollout_values import RolloutValueConfig
from jaxrag.train.distributed import lead_only

DECISIONS = ("search/search", "answer/search", "answer/answer")


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def credit_audit_stage(config, workdir, name) -> None:
    s = config[name]
    out = stage_dir(workdir, name)
    tok = load_tokenizer(workdir)
    retriever = make_retriever(config, workdir)
    agent = get_agent(s.agent, mode="plain")
    policy = stage_policy(workdir, s.policy, tok, config.get("sampler"))
    qs = stratified(load_questions(workdir, s.split), s.max_questions)
    k = config.index.k
    rc = rollout_config(config, s, n_candidates=s.n_candidates, temperature=s.temperature, seed=config.seed + 11)
    visited = CA.policy_states(policy, retriever, agent, qs, rc)
    add_reference_actions(visited, agent, config, workdir, teacher=s.teacher, oracle=s.oracle)
    # only states with two distinct candidates have a pair to score
    records = choose_states([r for r in visited if len(CA.distinct(r)) >= 2], s.states, config.seed)
    log(name, f"{len(records)} audit states of {len(visited)} the policy visited on {len(qs)} {s.split} questions")

    cfg = CA.AuditConfig(m=s.m, temperature=s.replay_temperature, max_steps=s.max_steps, k=k,
                         batch_size=s.batch_size, max_new_tokens=s.max_new_tokens, seed=config.seed + 13, z=s.z,
                         bootstrap=s.bootstrap)
    rst: dict = {}
    truth = CA.replay(policy, retriever, agent, records, cfg, stats=rst)
    write_records(out / "records_replay.jsonl", truth)
    ctx = audit_context(config, workdir, name, policy, retriever, agent, cfg)
    signals = {}
    for sig in s.signals:
        signals[sig] = CA.run_signal(sig, ctx, records)
        if "unavailable" in signals[sig]:
            log(name, f"signal {sig}: unavailable ({signals[sig]['unavailable']})")
    write_jsonl(out / "signals.jsonl", [
        {"qid": r.qid, "step": r.step, **{n: v["values"][i] for n, v in signals.items() if "values" in v}}
        for i, r in enumerate(records)])
    results = audit_results(truth, signals, cfg, rst, questions=len(qs), visited=len(visited))
    results["settings"] = {k_: (list(v) if isinstance(v, tuple) else v) for k_, v in s.to_dict().items()}
    write_json(out / "results.json", results)
    (out / "results.md").write_text(results_markdown(results))
    plot_audit(results, out / "credit_audit.png")
    head = results["signals"]
    log(name, f"{results['resolved_pairs']} of {results['pairs']} candidate pairs resolved by replay (M = {cfg.m}); "
              + "; ".join(f"{n} {num(v['replay']['accuracy'])}" for n, v in head.items() if "replay" in v))


def audit_context(config, workdir, name, policy, retriever, agent, cfg):
    """What the signals read, built as their own stages build it: the oracle judge at the index's k, the critic
    stage's scorer, the supervision stage's rollout-value settings (its M, temperature, batch and seed), the mcts
    stage's search settings and seed with the audit's per-candidate budget."""
    s, k = config[name], config.index.k
    sup = config[s.rollout_from]
    critic = None
    if s.critic:
        critic = critic_scorer(workdir, s.critic, agent, config.get("sampler"))
    rollout = (RolloutValueConfig(m=sup.rollout_m, temperature=sup.temperature, metric="em", max_steps=sup.max_steps,
                                  k=k, batch_size=sup.batch_size * sup.n_candidates,
                                  max_new_tokens=sup.max_new_tokens, seed=config.seed + 2) if sup.rollout_m else None)
    mcts = mcts_settings(s, config.seed) if s.get("mcts") else None
    return AuditContext(policy, retriever, agent, cfg, judge=get_judge("oracle", retriever=retriever, k=k),
                        llm_judge=llm_judge(config, workdir, name, policy), critic=critic, rollout=rollout, mcts=mcts)


def llm_judge(config, workdir, name, policy):
    """The llm_rank signal's judge: the rollout_from section's http_judge where it names an endpoint (as the
    supervision stage ranks its agreement states), else `llm_judge.policy`'s checkpoint through LocalJudge (greedy,
    `llm_judge.max_new_tokens`; the audited policy when it is the same stage); None when neither is set."""
    s = config[name]
    http = config[s.rollout_from].get("http_judge") or {}
    if http.get("base_url"):
        return get_judge("http", base_url=http["base_url"], model=http["model"])
    lj = s.get("llm_judge")
    if not lj or not lj.get("policy"):
        return None
    jp = policy if lj.policy == s.policy else stage_policy(workdir, lj.policy, load_tokenizer(workdir),
                                                           config.get("sampler"))
    return LocalJudge(jp, name=f"local:{lj.policy}", max_new_tokens=int(lj.max_new_tokens), seed=config.seed + 17)


def mcts_settings(s, seed: int):
    """The mcts signal's settings: `mcts` (the mcts stage's search: MCTSConfig fields under `search`; its
    temperature, max_new_tokens, batch_size), `mcts_rollouts` (simulations per distinct candidate) and the mcts
    stage's seed (the run's)."""
    m = s.mcts
    return MCTSSignalConfig(search=MCTSConfig(**m.search.to_dict()), per_candidate=int(s.mcts_rollouts),
                            temperature=float(m.temperature), max_new_tokens=int(m.max_new_tokens),
                            batch_size=int(m.batch_size), seed=seed)


def choose_states(records: list, n: int, seed: int) -> list:
    """At most n records, spread evenly over the strata (question type, hops, step, state kind): round robin over
    the strata in a seeded order, each stratum's records in a seeded order; all when n = 0 or n >= len."""
    if not n or n >= len(records):
        return list(records)
    rng = np.random.default_rng([seed, 23])
    groups = collections.defaultdict(list)
    for r in records:
        groups[(r.metadata.get("type"), r.metadata.get("hops"), r.step, state_kind(r))].append(r)
    queues = [list(rng.permutation(len(g))) for g in groups.values()]
    keys = list(groups)
    order = list(rng.permutation(len(keys)))
    picked = []
    while len(picked) < n:
        for gi in order:
            if queues[gi] and len(picked) < n:
                picked.append(groups[keys[gi]][queues[gi].pop()])
    return picked


def add_reference_actions(records: list, agent, config, workdir, *, teacher: bool, oracle: bool) -> None:
    """Append the teacher's action (its flaws drawn as in the teacher stage, seeded per question and step) and the
    oracle's flawless action to every record's candidates, in the agent's own format (origin "teacher" | "oracle")."""
    if not (teacher or oracle):
        return
    tsec = config.teacher
    tcfg = teacher_config(tsec)
    entities = read_jsonl(Path(workdir) / "world" / "entities.jsonl")
    pool = T.guess_pool_from_entities([e for e in entities if not e["heldout"]])
    stop = agent.stop[0] if agent.stop else ""
    for rec in records:
        q = {"id": rec.qid, "golden_answers": rec.gold, "metadata": rec.metadata}
        hist = []
        for st in rec.history:   # the policy's steps, each query tagged with the hop it was after (the first open)
            hop = T.next_hop(T.resolved_hops(q, hist)) if st.action.kind == "query" else None
            hist.append(T.TeacherStep(T.TeacherAction(st.action.kind, st.action.text, {"hop": hop, "flaw": "policy"}),
                                      [d.doc_id for d in st.docs]))
        acts = []
        if teacher:
            rng = T.episode_rng(world_seed(config) + 1000 * (rec.step + 1), rec.qid)
            acts.append(("teacher", T.teacher_action(q, hist, rng, tcfg, pool)))
        if oracle:
            acts.append(("oracle", T.oracle_action(q, hist)))
        for origin, a in acts:
            raw = agent.format(Action(a.kind, a.text, "", {})) + stop
            rec.candidates.append(ScoredCandidate(raw=raw, action=agent.parse(raw),
                                                  extra={"origin": origin, "flaw": a.extra.get("flaw")}))


def audit_results(truth: list, signals: dict, cfg, replay_stats: dict, **counts) -> dict:
    """Every signal scored against the replay and against the oracle's label (where the oracle ran)."""
    views = CA.replay_views(truth, cfg.z)
    n_states = max(len(truth), 1)
    res = {**counts, "states": len(truth), "candidates": sum(len(r.candidates) for r in truth),
           "distinct_candidates": sum(len(CA.distinct(r)) for r in truth),
           "pairs": sum(v.n_pairs for v in views), "resolved_pairs": sum(len(v.pairs) for v in views),
           "m": cfg.m, "z": cfg.z, "replay_seconds_per_state": replay_stats.get("total_s", 0.0) / n_states,
           "replay_policy_calls": replay_stats.get("policy_calls", 0),
           "tied_pairs": sum(v.tied for v in views),
           "resolved_by_decision": dict(collections.Counter(kind for v in views for *_, kind in v.pairs))}
    res["unresolved_share"] = 1 - res["resolved_pairs"] / res["pairs"] if res["pairs"] else None
    res["chance"] = chance_band(truth, views, cfg.seed)
    oracle_views = (CA.label_views(truth, signals["oracle"]["values"])
                    if "values" in signals.get("oracle", {}) else None)
    res["signals"] = {}
    for name, sig in signals.items():
        if "values" not in sig:
            res["signals"][name] = {"unavailable": sig["unavailable"]}
            continue
        vals = CA.on_distinct(truth, sig["values"])
        row = {"replay": CA.score_signal(views, vals, n_boot=cfg.bootstrap, seed=cfg.seed),
               "seconds_per_state": sig["seconds"] / n_states, "policy_calls": sig["policy_calls"],
               **{k: v for k, v in sig.items() if k in ("sampled_actions", "judge", "failed_states")}}
        if oracle_views is not None and name != "oracle":
            row["oracle"] = CA.score_signal(oracle_views, vals, n_boot=cfg.bootstrap, seed=cfg.seed,
                                            breakdown=("decision",))
        res["signals"][name] = row
    return res


def chance_band(truth: list, views: list, seed: int, draws: int = 200) -> dict:
    """What chance scores on these pairs: the pairwise accuracy of `draws` uniform random signals, overall and per
    decision kind (mean and 2.5-97.5 % quantiles). One random row is one draw; this is its null distribution."""
    rng = np.random.default_rng([seed, 31])
    acc = collections.defaultdict(list)
    for _ in range(draws):
        vals = CA.on_distinct(truth, [list(rng.random(len(r.candidates))) for r in truth])
        r = CA.score_signal(views, vals, n_boot=1, seed=seed, breakdown=("decision",))
        if r["accuracy"] is not None:
            acc["all"].append(r["accuracy"])
        for kind, d in r["by"]["decision"].items():
            if d["accuracy"] is not None:
                acc[kind].append(d["accuracy"])
    return {k: {"mean": float(np.mean(v)), "band": [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))],
                "draws": len(v)} for k, v in acc.items()}


def _ci(d: dict | None, key: str) -> str:
    if not d or d.get(key) is None:
        return "n/a"
    ci = d.get(key + "_ci")
    return f"{d[key]:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def results_markdown(res: dict) -> str:
    """The audit's tables: each signal against the replay and the oracle's label; per decision kind, question
    type, hops and state kind."""
    lines = ["# Credit audit", "",
             f"{res['states']} states ({res['candidates']} candidates, {res['distinct_candidates']} distinct), "
             f"{res['pairs']} candidate pairs; replay M = {res['m']} continuations per candidate (common random "
             f"numbers across a state's candidates) resolves {res['resolved_pairs']} of them "
             f"(unresolved share {num(res['unresolved_share'])}; {res['tied_pairs']} pairs had the same outcome in every "
             f"continuation; resolved: the paired difference's {res['z']}-sigma interval excludes 0). Intervals: "
             "95 % percentile bootstrap over states. Chance on these pairs (200 uniform random signals): "
             + "; ".join(f"{k} {v['mean']:.3f} [{v['band'][0]:.3f}, {v['band'][1]:.3f}]"
                         for k, v in res.get("chance", {}).items()) + ".", "",
             "| signal | accuracy vs replay | pairs | AUROC good/bad | Spearman per state | accuracy vs oracle label "
             "| s/state | policy calls |", "|---|---|---|---|---|---|---|---|"]
    for name, row in res["signals"].items():
        if "unavailable" in row:
            lines.append(f"| {name} | unavailable: {row['unavailable']} | | | | | | |")
            continue
        r, o = row["replay"], row.get("oracle")
        lines.append(f"| {name} | {_ci(r, 'accuracy')} | {r['pairs']} | {_ci(r, 'auroc')} | {_ci(r, 'spearman')} | "
                     f"{_ci(o, 'accuracy') if o else '(itself)'} | {row['seconds_per_state']:.3f} | "
                     f"{row['policy_calls']} |")
    notes = [f"{name}: judge {row.get('judge') or '?'}, {row['failed_states']} of {res['states']} states unscored "
             "(reply did not parse)" for name, row in res["signals"].items() if row.get("failed_states")]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    for dim, title in (("decision", "decision kind (the pair's two actions)"), ("type", "question type"),
                       ("hops", "hops"), ("state", "state kind (oracle: every hop found = answer)")):
        groups = sorted({g for row in res["signals"].values() if "replay" in row for g in row["replay"]["by"][dim]})
        if not groups:
            continue
        lines += ["", f"## Accuracy vs replay by {title}", "", "| signal | " + " | ".join(groups) + " |",
                  "|---|" + "---|" * len(groups)]
        for name, row in res["signals"].items():
            if "replay" not in row:
                continue
            by = row["replay"]["by"][dim]
            lines.append(f"| {name} | " + " | ".join(
                f"{_ci(by.get(g), 'accuracy')} ({by[g]['pairs'] if g in by else 0})" for g in groups) + " |")
    return "\n".join(lines) + "\n"


def plot_audit(res: dict, path) -> None:
    """Pairwise accuracy vs replay per signal, overall and per decision kind, with bootstrap intervals; 0.5 marks
    chance."""
    names = [n for n, r in res["signals"].items() if "replay" in r]
    groups = ["all"] + [d for d in DECISIONS if any(d in res["signals"][n]["replay"]["by"]["decision"] for n in names)]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(names) + 2), 4))
    width = 0.8 / len(groups)
    for gi, g in enumerate(groups):
        xs, ys, lo, hi = [], [], [], []
        for i, n in enumerate(names):
            r = res["signals"][n]["replay"]
            d = r if g == "all" else r["by"]["decision"].get(g)
            if not d or d.get("accuracy") is None:
                continue
            xs.append(i + (gi - (len(groups) - 1) / 2) * width)
            ys.append(d["accuracy"])
            ci = d.get("accuracy_ci") or [d["accuracy"]] * 2
            lo.append(d["accuracy"] - ci[0])
            hi.append(ci[1] - d["accuracy"])
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3, label=g)
    band = res.get("chance", {}).get("all")
    if band:
        ax.axhspan(*band["band"], color="gray", alpha=0.15, label="chance (95 % of random signals)")
    ax.axhline(0.5, color="gray", ls="--", lw=1)
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set(ylim=(0, 1.02), ylabel="pairwise accuracy vs replay (95% CI)",
           title=f"credit audit: {res['states']} states, {res['resolved_pairs']} resolved pairs")
    save_figure(fig, (ax,), path)


def check_audit(config, name: str) -> None:
    """check_stage, every signal resolves, the sizes are in range and rollout_from names a sampling section."""
    checks.check_stage(config, name)
    s = config[name]
    for i, sig in enumerate(s.signals):
        get_signal(sig, f"config.{name}.signals[{i}]")   # an unknown name fails here, in one line
    for key, low in (("m", 2), ("n_candidates", 1), ("max_steps", 1), ("max_new_tokens", 1), ("batch_size", 1),
                     ("bootstrap", 1), ("states", 0), ("max_questions", 0)):
        if int(s[key]) < low:
            config_fail(f"{name}.{key}", f"{s[key]} must be >= {low}")
    if s.split not in checks.SPLITS:
        config_fail(f"{name}.split", f"{s.split!r}: choose {' | '.join(checks.SPLITS)}")
    if "mcts" in s.signals:
        if not s.get("mcts") or "mcts_rollouts" not in s:
            config_fail(f"{name}.mcts", "the mcts signal needs the mcts stage's settings (`mcts`: search, temperature, "
                                        "max_new_tokens, batch_size) and `mcts_rollouts`; or drop it from signals")
        if int(s.mcts_rollouts) < 1:
            config_fail(f"{name}.mcts_rollouts", f"{s.mcts_rollouts} must be >= 1 (simulations per distinct candidate)")
        try:
            mcts_settings(s, config.seed)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            config_fail(f"{name}.mcts", f"{e} (see configs/synthetic/credit_audit.py)")
    lj = s.get("llm_judge")
    if lj and lj.get("policy") and lj.policy not in config:
        config_fail(f"{name}.llm_judge.policy", f"{lj.policy!r} is not a stage of this config (a stage whose "
                                                "checkpoint judges, e.g. 'sft'; '' for none)")
    src = config.get(s.rollout_from)
    if src is None or "rollout_m" not in src:
        config_fail(f"{name}.rollout_from", f"{s.rollout_from!r} is not a section with rollout_m (the supervision "
                                            "stage's section)")


credit_audit_stage.check_config = check_audit
