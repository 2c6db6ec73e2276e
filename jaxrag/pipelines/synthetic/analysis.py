"""Two studies of the learned critic: annotator agreement (RAG-Gym Table 4 analogue) and accuracy vs N for
PRM-guided best-of-N (RAG-Gym Fig. 4 analogue).

agreement: config[name].records (the supervision stage: its agreement/records_<source>.jsonl on dev states),
critic (the critic stage, which scores the same states). Pairwise ranking agreement of every source with the oracle.
bestofn: config[name].policy, critic, agent, ns (candidates per step), split, max_questions, temperature. For each N,
the critic's argmax vs the first valid sample (no critic) at the same N. Outputs: bestofn.json (EM per N and
selector, and per N > 1 the paired comparisons critic vs first valid and each vs greedy: difference, interval, MDE,
disagreement), bestofn.png and episodes_n<N>_<selector>.jsonl (per question: jaxrag.pipelines.synthetic.seeds).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from jaxrag.console import num, standard_error
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import write_episodes
from jaxrag.env.rollout import rollout
from jaxrag.evaluate import describe_difference, paired_components
from jaxrag.metrics import exact_match
from jaxrag.pipelines.common import log, stage_dir, write_json
from jaxrag.pipelines.synthetic import checks
from jaxrag.pipelines.synthetic.evaluate import score_episodes, stratified
from jaxrag.pipelines.synthetic.preference import critic_scorer, critic_select
from jaxrag.pipelines.synthetic.report import binomial_bars, plt, save_figure
from jaxrag.pipelines.synthetic.world import (load_questions, load_tokenizer, make_retriever, rollout_config,
                                              stage_policy)
from jaxrag.supervision.agreement import agreement_table, write_agreement
from jaxrag.supervision.critic import score_records
from jaxrag.supervision.records import read_records, write_records
from jaxrag.train.distributed import lead_only


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def agreement_stage(config, workdir, name) -> None:
    s = config[name]
    src_dir = Path(workdir) / s.records / "agreement"
    sources = {p.stem.removeprefix("records_"): read_records(p) for p in sorted(src_dir.glob("records_*.jsonl"))}
    if "oracle" not in sources or not sources["oracle"]:
        raise FileNotFoundError(f"{src_dir}/records_oracle.jsonl: missing or empty (run the supervision stage)")
    agent = get_agent(s.agent, mode="plain")
    sources["critic"] = score_records(critic_scorer(workdir, s.critic, agent, config.get("sampler")), sources["oracle"])
    out = stage_dir(workdir, name)
    write_records(out / "records_critic.jsonl", sources["critic"])
    rows = agreement_table(sources, reference="oracle")
    write_agreement(rows, out)
    write_json(out / "agreement.json", rows)
    log(name, "; ".join(f"{r['source']} agrees with {r['reference']} on {r['agree']} of {r['pairs']} pairs "
                        f"({num(r['agreement'])})" for r in rows))


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def bestofn_stage(config, workdir, name) -> None:
    s = config[name]
    tok = load_tokenizer(workdir)
    retriever = make_retriever(config, workdir)
    agent = get_agent(s.agent, mode="plain")
    policy = stage_policy(workdir, s.policy, tok, config.get("sampler"))
    select = critic_select(workdir, s.critic, tok, agent, config.get("sampler"))
    qs = stratified(load_questions(workdir, s.split), s.max_questions)
    qmap = {q["id"]: q for q in qs}
    out = stage_dir(workdir, name)
    rows, em = [], {}
    for n in s.ns:
        rc = dataclasses.replace(rollout_config(config, s), n_candidates=n, temperature=s.temperature if n > 1 else 0.0)
        for selector in ("critic", "first_valid"):
            if selector == "first_valid" and n == 1:
                continue  # the same greedy run as the critic's N = 1
            eps = rollout(policy, retriever, agent, qs, dataclasses.replace(rc, progress=True),
                          select=select if selector == "critic" else None)
            write_episodes(out / f"episodes_n{n}_{selector}.jsonl", eps)
            m = score_episodes(eps, qmap)["all"]
            rows.append({"n": n, "selector": selector, "em": m["em"], "f1": m["f1"], "n_questions": m["n"],
                         "searches_mean": m["searches_mean"]})
            em[(n, selector)] = {ep.qid: float(exact_match(ep.answer, ep.gold)) for ep in eps}
            log(name, f"N={n} {selector}: EM {num(m['em'])} ± {num(standard_error(m['em'], m['n']))} (n {m['n']})")
    comparisons = bestofn_comparisons(em, [q["id"] for q in qs])
    for c in comparisons:
        log(name, describe_difference(c["a"], c["b"], c) + f"; MDE {c['mde']:.3f}, disagree {c['disagree']:.3f}")
    write_json(out / "bestofn.json", {"split": s.split, "temperature": s.temperature, "rows": rows,
                                      "comparisons": comparisons})
    plot_bestofn(rows, out / "bestofn.png", s.split)


def bestofn_comparisons(em: dict, qids: list[str]) -> list[dict]:
    """Per N > 1, paired on the same questions (jaxrag.evaluate.paired_components, one seed): the critic's pick vs
    the first valid sample, and each vs the greedy N = 1 run. em: (n, selector) -> {qid: EM}."""
    def name(n, sel):
        return f"bo{n}_{sel}" if n > 1 else "greedy"

    out = []
    for n in sorted({n for n, _ in em if n > 1}):
        pairs = [((n, "critic"), (n, "first_valid"))] + [((n, sel), (1, "critic")) for sel in ("critic", "first_valid")]
        for a, b in pairs:
            if a in em and b in em:
                r = paired_components([em[a][q] for q in qids], [em[b][q] for q in qids])
                out.append({"a": name(*a), "b": name(*b), **r})
    return out


def plot_bestofn(rows: list[dict], path, split: str) -> None:
    """EM vs N on a linear axis, the critic's pick and the first valid sample (N = 1: the one greedy run, shared),
    with binomial SE bars over the split's questions (one seed)."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    greedy = [r for r in rows if r["n"] == 1]
    for i, (selector, label) in enumerate((("critic", "critic argmax (PRM best-of-N)"),
                                           ("first_valid", "first valid sample"))):
        pts = sorted(greedy + [r for r in rows if r["selector"] == selector and r["n"] > 1], key=lambda r: r["n"])
        em = [r["em"] for r in pts]
        ax.errorbar([r["n"] + (i - 0.5) * 0.08 for r in pts], em, marker="o", capsize=3, label=label,
                    yerr=binomial_bars(em, [r["n_questions"] for r in pts]))
    ns = sorted({r["n"] for r in rows})
    ax.set(xlabel="candidates per step (N)", ylabel="EM (+/- binomial SE)", title=f"best-of-N ({split})")
    ax.set_xticks(ns, [str(n) for n in ns])
    save_figure(fig, (ax,), path)


# jaxrag.main checks the config before any stage runs
agreement_stage.check_config = checks.check_stage
bestofn_stage.check_config = checks.check_stage
