"""SmartSearch's curriculum data on a real QA file (004 §4.2-4.4): `smartsearch_stage` (credit, refinement, the
SFT / DPO rows of stages 1 and 2 and their outcome-only ablations). The actor, retriever, agent and judge sections are
read as RAG-Gym's ranking_stage reads them (jaxrag.pipelines.collect)."""

from __future__ import annotations

import dataclasses

from jaxrag.data.qa import load_qa
from jaxrag.env.mdp import write_episodes
from jaxrag.env.rollout import RolloutConfig, rollout
from jaxrag.pipelines.collect import actor, check_actor, check_judge, check_questions, make_judge, write_rows
from jaxrag.pipelines.common import config_fail, log, plain, resolve, stage_dir, write_json
from jaxrag.supervision import smartsearch as SS
from jaxrag.supervision.records import Pair, write_records
from jaxrag.train.distributed import lead_only


def outcome_pairs(episodes, agent, cfg) -> list:
    """Stage 2 "w/o process rewards" (004 §5.3: preference "based exclusively on the final answer correctness"): per
    question, the first correct trajectory ≻ the first incorrect one (input order: sampled, then refined); margin 1."""
    groups: dict = {}
    for ep in episodes:
        groups.setdefault(ep.qid, []).append(ep)
    out = []
    for qid, group in groups.items():
        right = [ep for ep in group if SS.is_correct(ep, cfg)]
        wrong = [ep for ep in group if not SS.is_correct(ep, cfg)]
        if right and wrong:
            out.append(Pair(agent.render(group[0].state(0)), SS.trajectory_text(right[0], agent),
                            SS.trajectory_text(wrong[0], agent), 1.0, "outcome", qid, 0))
    return out


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def smartsearch_stage(config, workdir, name) -> None:
    """SmartSearch's curriculum data (004 §4.2-4.4; released scripts/data_construction) on a real QA file: the
    policy's trajectories, dual-level credit (novelty by rule + usefulness by the judge, 004 App. A), and with
    `refine` every S_t = 0 query rewritten by the judge and the trajectory regenerated from it
    (jaxrag.supervision.smartsearch: assess, refine, sft_filter, dpo_pairs).
    config[name]: policy, retriever, agent, questions ({path, select}), judge (as ranking_stage's: it scores
    usefulness and refines; the paper's is a Qwen2.5-3B student of Qwen3-32B), rollout (RolloutConfig fields: the
    sampling of the `samples` trajectories per question), refine (bool), smartsearch (SmartSearchConfig fields).
    Writes under workdir/<name>/ text rows for jaxrag.pipelines.train (prompt = the agent's first prompt, completion /
    chosen / rejected = the trajectory as the agent renders it, results included, as the released transfer_*.py
    take the whole response): sft.jsonl (stage 1: correct, well formed, every S_t = 1), sft_outcome.jsonl (stage 1
    "w/o process rewards": correct and well formed), dpo.jsonl (stage 2: dpo_pairs over the sampled and refined
    trajectories), dpo_outcome.jsonl (stage 2 "w/o process rewards": `outcome_pairs`), episodes.jsonl,
    records.jsonl (per-step credit), stats.json."""
    sc = config[name]
    out = stage_dir(workdir, name)
    policy, retriever, agent = actor(sc, name, workdir)
    questions = load_qa(resolve(sc.questions.path, workdir), sc.questions.get("select") or None)
    judge = make_judge(plain(sc.judge), workdir, policy)
    cfg = SS.SmartSearchConfig(**plain(sc.smartsearch)).validate()
    rc = RolloutConfig(**plain(sc.rollout))
    episodes = rollout(policy, retriever, agent, [q for q in questions for _ in range(int(sc.samples))], rc)
    SS.assess(episodes, judge, cfg)
    refined = SS.Refinement([], [], 0)
    if sc.refine:
        refined = SS.refine(episodes, judge, policy, retriever, agent, dataclasses.replace(rc, seed=rc.seed + 37))
        SS.assess(refined.episodes, judge, cfg)
    every = episodes + refined.episodes

    def rows(eps, key: str) -> list[dict]:
        return [{"prompt": agent.render(ep.state(0)), key: SS.trajectory_text(ep, agent), "qid": ep.qid} for ep in eps]

    def pair_rows(pairs) -> list[dict]:
        return [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected, "qid": p.qid, "margin": p.margin}
                for p in pairs]

    sft = SS.sft_filter(every, cfg)
    sft_outcome = [ep for ep in every if SS.is_correct(ep, cfg) and SS.format_check(ep)[0]]
    pairs, pairs_outcome = SS.dpo_pairs(every, agent, cfg), outcome_pairs(every, agent, cfg)
    write_rows(out / "sft.jsonl", rows(sft, "completion"))
    write_rows(out / "sft_outcome.jsonl", rows(sft_outcome, "completion"))
    write_rows(out / "dpo.jsonl", pair_rows(pairs))
    write_rows(out / "dpo_outcome.jsonl", pair_rows(pairs_outcome))
    write_episodes(out / "episodes.jsonl", every)
    write_records(out / "records.jsonl", SS.credit_records(every, agent))
    stats = {"questions": len(questions), "sampled": len(episodes), "refine_requests": refined.requests,
             "refined": len(refined.episodes), "refine_failures": len(refined.failures), "sft": len(sft),
             "sft_outcome": len(sft_outcome), "pairs": len(pairs), "pairs_outcome": len(pairs_outcome),
             "correct_sampled": sum(SS.is_correct(e, cfg) for e in episodes),
             "search_quality_sampled": SS.search_quality(episodes, cfg), "judge": judge.name}
    write_json(out / "stats.json", stats)
    log(name, f"{len(episodes)} trajectories ({stats['correct_sampled']} correct), {refined.requests} queries refined "
              f"into {len(refined.episodes)} trajectories; rows: sft {len(sft)}, sft_outcome {len(sft_outcome)}, "
              f"dpo {len(pairs)}, dpo_outcome {len(pairs_outcome)}")


def check_smartsearch(config, name: str) -> None:
    sc = config[name]
    check_actor(config, name, ("policy", "retriever", "questions", "agent", "judge", "rollout", "samples", "refine",
                               "smartsearch"))
    check_questions(f"{name}.questions", plain(sc.questions))
    for key, cls in (("rollout", RolloutConfig), ("smartsearch", SS.SmartSearchConfig)):
        try:
            obj = cls(**plain(sc[key]))
        except (TypeError, ValueError) as e:
            config_fail(f"{name}.{key}", str(e))
        if key == "smartsearch":
            try:
                obj.validate()
            except ValueError as e:
                config_fail(f"{name}.{key}", str(e))
    if int(sc.samples) < 1:
        config_fail(f"{name}.samples", f"{sc.samples}: must be >= 1")
    check_judge(name, plain(sc.judge), "the process-reward model's endpoint")


smartsearch_stage.check_config = check_smartsearch
