"""The SmartSearch curriculum in the synthetic world (004 §4; jaxrag.supervision.smartsearch), judged by the oracle.

curriculum_data_stage, config[name]: policy, agent, max_questions (the seeded train subset), samples (trajectories
per question at `temperature`), max_steps, batch_size, max_new_tokens, smartsearch (SmartSearchConfig fields). The policy's trajectories get dual-level
credit (novelty + the oracle's usefulness: does the query's result resolve an open hop), every search with S_t = 0 is
refined (the oracle rewrites the query for the first unresolved hop) and the trajectory regenerated from there.
Outputs: episodes.jsonl (sampled + refined), sft_episodes.jsonl (stage 1: correct, well formed, every S_t = 1),
pairs.jsonl (stage 2: trajectory pairs per question), records_smartsearch.jsonl (per-step credit), stats.json (SQ of
the policy's own samples, refinement counts).
episodes_sft_stage, config[name]: data (the stage whose sft_episodes.jsonl to read), init (the model to fine-tune),
agent, max_len, and `train` (loss "sft"). Stage 2 is the preference stage (DPO) on data's pairs from this model;
stage 3 is an RL stage with the "smartsearch" reward.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import read_episodes, write_episodes
from jaxrag.env.rollout import rollout
from jaxrag.pipelines.common import load_checkpoint, log, model_dir, save_checkpoint, stage_dir, write_json
from jaxrag.pipelines.synthetic import checks
from jaxrag.pipelines.synthetic.sft import sft_on_episodes
from jaxrag.pipelines.synthetic.supervise import sampling_setup
from jaxrag.pipelines.synthetic.world import rollout_config, tokenizer_path
from jaxrag.supervision import smartsearch as SS
from jaxrag.supervision.judges import get_judge
from jaxrag.supervision.records import write_pairs, write_records
from jaxrag.train.distributed import is_lead, lead_only


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def curriculum_data_stage(config, workdir, name) -> None:
    s, out, retriever, agent, policy, questions = sampling_setup(config, workdir, name)
    rc = rollout_config(config, s, temperature=s.temperature, reward="f1", seed=config.seed + 31)
    items = [q for q in questions for _ in range(s.samples)]  # contiguous samples per question
    episodes = rollout(policy, retriever, agent, items, rc)
    chains = {q["id"]: q["metadata"]["gold_chain"] for q in questions}
    for ep in episodes:
        ep.metadata["gold_chain"] = chains[ep.qid]  # what the oracle judge reads
    oracle = get_judge("oracle", retriever=retriever, k=config.index.k)
    cfg = SS.SmartSearchConfig(**s.smartsearch.to_dict()).validate()
    SS.assess(episodes, oracle, cfg)
    refined = SS.refine(episodes, oracle, policy, retriever, agent, dataclasses.replace(rc, seed=config.seed + 37))
    SS.assess(refined.episodes, oracle, cfg)
    every = episodes + refined.episodes
    sft_eps = SS.sft_filter(every, cfg)
    pairs = SS.dpo_pairs(every, agent, cfg)
    write_episodes(out / "episodes.jsonl", every)
    write_episodes(out / "sft_episodes.jsonl", sft_eps)
    write_pairs(out / "pairs.jsonl", pairs)
    write_records(out / "records_smartsearch.jsonl", SS.credit_records(every, agent))
    stats = {"questions": len(questions), "sampled": len(episodes), "refine_requests": refined.requests,
             "refined": len(refined.episodes), "refine_failures": len(refined.failures), "sft_episodes": len(sft_eps),
             "pairs": len(pairs), "search_quality_sampled": SS.search_quality(episodes, cfg),
             "search_quality_refined": SS.search_quality(refined.episodes, cfg) if refined.episodes else None,
             "correct_sampled": sum(SS.is_correct(e, cfg) for e in episodes)}
    write_json(out / "stats.json", stats)
    log(name, f"{len(episodes)} trajectories ({stats['correct_sampled']} correct), {refined.requests} searches "
              f"refined into {len(refined.episodes)} trajectories, {len(sft_eps)} for SFT, {len(pairs)} DPO pairs, "
              f"SQ {stats['search_quality_sampled']}")


def episodes_sft_stage(config, workdir, name) -> None:
    """Stage 1: SFT of `init`'s model on the data stage's sft_episodes.jsonl (packed, loss on action tokens)."""
    s = config[name]
    path = Path(workdir) / s.data / "sft_episodes.jsonl"
    episodes = read_episodes(path)
    if not episodes:  # recorded, not hidden: stage 2 then starts from the unchanged model
        log(name, f"{path}: no trajectory passed the stage-1 filter; stage 1 SKIPPED, {s.init}'s model kept as is")
        mcfg, params = load_checkpoint(model_dir(workdir, s.init))
        save_checkpoint(model_dir(workdir, name), mcfg, params, tokenizer_path(workdir))
        if is_lead():
            write_json(stage_dir(workdir, name) / "summary.json", {"episodes": 0, "steps": 0, "skipped": True})
        return
    sft_on_episodes(workdir, name, episodes, get_agent(s.agent, mode="plain"), s.init, s.max_len, s.train)


# jaxrag.main checks the config before any stage runs
curriculum_data_stage.check_config = checks.check_sampling
episodes_sft_stage.check_config = checks.check_stage
