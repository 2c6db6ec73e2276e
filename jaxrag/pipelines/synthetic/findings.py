"""The findings report (configs/synthetic/findings.py): the longer studies side by side, as measured.

config[name]: eval (the main eval stage's name: its results.json holds the demo's systems), eval_findings (the
findings' own eval stage), sources (rows of the supervision-source study: {"system", "pairs_from"}: a DPO system and
the stage whose pairs and stats.json it trained on; pairs_from "" = the policy it starts from), grpo (GRPO stages
to compare, e.g. k2 vs k3 KL estimators: {"system", "stage"}), bestofn (best-of-N stages: {"label", "stage"}),
smartsearch ({"data": the curriculum's data stage, "systems": the systems whose test episodes get SQ}; optional),
agreement (agreement stages whose critic row to show: {"label", "stage"}; optional).
Outputs under workdir/<name>/: findings.md, grpo_curves.png.
"""

from __future__ import annotations

from pathlib import Path

from jaxrag.env.mdp import read_episodes
from jaxrag.jsonl import iter_jsonl
from jaxrag.pipelines.common import log, read_json, stage_dir
from jaxrag.pipelines.synthetic import checks
from jaxrag.pipelines.synthetic.report import plt, save_figure
from jaxrag.pipelines.synthetic.world import load_questions, make_retriever
from jaxrag.supervision import smartsearch as SS
from jaxrag.supervision.judges import get_judge
from jaxrag.train.distributed import lead_only


def _systems(workdir, *stages) -> dict:
    out = {}
    for st in stages:
        p = Path(workdir) / st / "results.json"
        if p.exists():
            out.update(read_json(p)["systems"])
    return out


def _em_f1(systems: dict, name: str, split: str) -> str:
    r = systems.get(name, {}).get("splits", {}).get(split, {}).get("all")
    return f"{r['em']:.3f} / {r['f1']:.3f}" if r else "–"


def _rl_rows(workdir, stage: str) -> list[dict]:
    p = Path(workdir) / stage / "metrics.jsonl"
    if not p.exists():
        return []
    last = {r["step"]: r for _, r in iter_jsonl(p) if "reward/mean" in r and "step" in r}
    return [last[s] for s in sorted(last)]


def plot_grpo(curves: dict[str, list[dict]], path) -> None:
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    for label, rows in curves.items():
        steps = [r["step"] for r in rows]
        a.plot(steps, [r["reward/mean"] for r in rows], marker="o", ms=2, label=label)
        b.plot(steps, [r.get("kl/k1", float("nan")) for r in rows], marker="o", ms=2, label=label)
        c.plot(steps, [max((v for k, v in r.items() if k.startswith("grad_max_abs/")), default=float("nan"))
                       for r in rows], marker="o", ms=2, label=label)
    a.set(xlabel="RL step", ylabel="mean reward (EM) of the step's rollouts", title="GRPO reward")
    b.set(xlabel="RL step", ylabel="KL to the reference (k1 estimate, per token)", title="GRPO KL")
    c.set(xlabel="RL step", ylabel="max |gradient| over layers (ARENA's spikes)", yscale="log", title="GRPO gradients")
    save_figure(fig, (a, b, c), path)


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def findings_stage(config, workdir, name) -> None:
    s = config[name]
    systems = _systems(workdir, s.eval, s.eval_findings)
    out = stage_dir(workdir, name)
    md = [f"# Findings (synthetic world, seed {config.seed})", "",
          "EM / F1 on the test split and on held-out entities (names never seen in training); greedy decoding.", ""]

    md += ["## Where process supervision comes from, at equal compute", "",
           "DPO from the SFT policy on process-level pairs from each source; compute = policy outputs sampled to "
           "collect them.", "",
           "| system | pairs from | sampled actions | pairs | test EM / F1 | held-out EM / F1 |", "|---|---|---|---|---|---|"]
    for row in s.sources:
        stats = read_json(Path(workdir) / row["pairs_from"] / "stats.json") if row["pairs_from"] else {}
        md.append(f"| {row['system']} | {row['pairs_from'] or '–'} | {stats.get('sampled_actions_all', '–')} | "
                  f"{stats.get('pairs', '–')} | {_em_f1(systems, row['system'], 'test')} | "
                  f"{_em_f1(systems, row['system'], 'heldout')} |")

    curves = {g["system"]: _rl_rows(workdir, g["stage"]) for g in s.grpo}
    md += ["", "## GRPO: the KL estimator", "",
           "| system | KL estimator | β | RL steps | reward first → last | test EM / F1 | held-out EM / F1 |",
           "|---|---|---|---|---|---|---|"]
    for g in s.grpo:
        rows, tc = curves[g["system"]], config[g["stage"]].train.grpo
        rew = f"{rows[0]['reward/mean']:.3f} → {rows[-1]['reward/mean']:.3f}" if rows else "–"
        md.append(f"| {g['system']} | {tc.kl_estimator} | {tc.beta} | {len(rows)} | {rew} | "
                  f"{_em_f1(systems, g['system'], 'test')} | {_em_f1(systems, g['system'], 'heldout')} |")
    plot_grpo(curves, out / "grpo_curves.png")
    md += ["", "![GRPO curves](grpo_curves.png)"]

    md += ["", "## The critic on another policy", "",
           "PRM-guided best-of-N with the critic trained on the ReAct policy's pairs: on that policy, and on the "
           "Re²Search policy (another output format), against the first valid sample at the same N.", "",
           "| policy | N | selector | EM | F1 |", "|---|---|---|---|---|"]
    for b in s.bestofn:
        p = Path(workdir) / b["stage"] / "bestofn.json"
        if p.exists():
            md += [f"| {b['label']} | {r['n']} | {r['selector']} | {r['em']:.3f} | {r['f1']:.3f} |"
                   for r in read_json(p)["rows"]]
    if s.get("agreement"):
        md += ["", "## The critic's agreement with the oracle", "",
               "Pairwise ranking agreement on the supervision stage's held-out dev states (candidate pairs the oracle "
               "scores apart; a tie under the critic counts as disagreement).", "",
               "| critic | agreement | pairs |", "|---|---|---|"]
        for a in s.agreement:
            p = Path(workdir) / a["stage"] / "agreement.json"
            rows = [r for r in read_json(p) if r["source"] == "critic"] if p.exists() else []
            md += [f"| {a['label']} | {r['agreement']:.3f} | {r['pairs']} |" if r["agreement"] is not None
                   else f"| {a['label']} | – | {r['pairs']} |" for r in rows]
    if s.get("smartsearch"):
        md += smartsearch_section(config, workdir, s.smartsearch, systems, (s.eval, s.eval_findings))
    (out / "findings.md").write_text("\n".join(md) + "\n")
    log(name, f"{out / 'findings.md'}, {out / 'grpo_curves.png'}")


def search_quality_of(episodes, chains: dict, oracle) -> dict:
    """SmartSearch's Perfect / Partial / SQ of eval episodes, every search credited by the oracle (novelty + does
    the query's result resolve an open hop of the gold chain, `chains[qid]`), as the curriculum's data stage credits
    them."""
    for ep in episodes:
        ep.metadata["gold_chain"] = chains[ep.qid]
    SS.assess(episodes, oracle)
    return SS.search_quality(episodes)


def smartsearch_section(config, workdir, ss, systems: dict, eval_stages) -> list[str]:
    chains = {q["id"]: q["metadata"]["gold_chain"] for q in load_questions(workdir, "test")}
    oracle = get_judge("oracle", retriever=make_retriever(config, workdir), k=config.index.k)

    st = read_json(Path(workdir) / ss["data"] / "stats.json")
    md = ["", "## The SmartSearch curriculum (SFT → DPO → GRPO)", "",
          f"Data from the SFT policy: {st['sampled']} trajectories ({st['correct_sampled']} correct), "
          f"{st['refine_requests']} searches refined into {st['refined']} regenerated trajectories "
          f"({st['refine_failures']} not refinable), {st['sft_episodes']} kept for stage 1, {st['pairs']} stage-2 "
          f"pairs. SQ of the sampled trajectories {st['search_quality_sampled']['sq']:.3f}"
          + (f", of the refined ones {st['search_quality_refined']['sq']:.3f}" if st["search_quality_refined"]
             else "") + ".", "",
          "SQ = Perfect (right answer, every search novel and useful) + Partial (wrong answer, some search good), "
          "searches credited by the oracle, on the test split.", "",
          "| system | test EM / F1 | held-out EM / F1 | test Perfect | test Partial | test SQ |", "|---|---|---|---|---|---|"]
    for name in ss["systems"]:
        path = next((Path(workdir) / e / f"episodes_{name}_test.jsonl" for e in eval_stages
                     if (Path(workdir) / e / f"episodes_{name}_test.jsonl").exists()), None)
        q = search_quality_of(read_episodes(path), chains, oracle) if path else None
        cells = [f"{q['perfect']:.3f}", f"{q['partial']:.3f}", f"{q['sq']:.3f}"] if q else ["–"] * 3
        md.append(f"| {name} | {_em_f1(systems, name, 'test')} | {_em_f1(systems, name, 'heldout')} | "
                  + " | ".join(cells) + " |")
    return md


# jaxrag.main checks the config before any stage runs
findings_stage.check_config = checks.check_stage
