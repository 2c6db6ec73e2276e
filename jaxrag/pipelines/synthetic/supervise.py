"""Process-reward collection in the synthetic world (RAG-Gym ranking collection, METHODS.md §5), with the SFT policy.

config[name]: policy (the stage whose model samples), agent, max_questions (train questions, a seeded subset),
n_candidates, temperature, max_steps, batch_size, max_new_tokens, outcome_threshold (keep a trajectory iff its
answer's F1 > threshold), agreement_questions (dev questions whose states every annotator scores, for the
agreement table; never trained on), rollout_m (Math-Shepherd continuations per candidate on those states; 0 = off),
http_judge ({} or {base_url, model}: an OpenAI-compatible judge ranking the same states with RAG-Gym's prompt).
The oracle (the world's gold chain) scores each candidate 0/1 (a "step_score" request: a tie-aware score, where
RAG-Gym's 1/(1+rank) would rank equally good candidates apart and pair them against each other).
Outputs under workdir/<name>/: records_oracle.jsonl + pairs.jsonl (train states: chosen ≻ rejected at one state),
episodes.jsonl (every collected train trajectory), agreement/records_<source>.jsonl (dev states), stats.json.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import NamedTuple

from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import write_episodes
from jaxrag.pipelines.common import log, stage_dir, write_json
from jaxrag.pipelines.synthetic import checks
from jaxrag.pipelines.synthetic.world import (load_questions, load_tokenizer, make_retriever, sampling_questions,
                                              stage_policy)
from jaxrag.supervision.judges import get_judge, judge_records
from jaxrag.supervision.ranking import RankingConfig, collect_ranking, ranking_pairs
from jaxrag.supervision.records import failures_line, judge_failures, write_pairs, write_records
from jaxrag.supervision.rollout_values import RolloutValueConfig, rollout_values
from jaxrag.train.distributed import lead_only


class Sampling(NamedTuple):
    """What every stage that samples from a trained policy on train questions starts from."""

    s: object  # config[name]
    out: Path  # workdir/<name>
    retriever: object
    agent: object  # the plain-text agent design config[name].agent
    policy: object  # the model of stage config[name].policy
    questions: list  # the seeded train subset of config[name].max_questions


def sampling_setup(config, workdir, name) -> Sampling:
    s = config[name]
    return Sampling(s, stage_dir(workdir, name), make_retriever(config, workdir), get_agent(s.agent, mode="plain"),
                    stage_policy(workdir, s.policy, load_tokenizer(workdir), config.get("sampler")),
                    sampling_questions(config, workdir, s.max_questions))


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def supervision_stage(config, workdir, name) -> None:
    s, out, retriever, agent, policy, questions = sampling_setup(config, workdir, name)
    judge = get_judge("oracle", retriever=retriever, k=config.index.k)
    rc = RankingConfig(n_candidates=s.n_candidates, temperature=s.temperature, max_steps=s.max_steps,
                       k=config.index.k, batch_size=s.batch_size, max_new_tokens=s.max_new_tokens,
                       outcome_metric="f1", outcome_threshold=s.outcome_threshold, seed=config.seed,
                       judge_kind="step_score", progress=True)
    episodes: list = []
    records, stats = collect_ranking(policy, retriever, agent, judge, questions, rc, episodes=episodes)
    write_records(out / "records_oracle.jsonl", records)
    write_episodes(out / "episodes.jsonl", episodes)
    pairs = ranking_pairs(records)
    write_pairs(out / "pairs.jsonl", pairs)
    stats["pairs"] = len(pairs)
    stats["sampled_actions_all"] = stats["states"] * s.n_candidates  # the outcome baseline samples as many

    # Annotators on held-out (dev) states: the oracle, rollout values, an HTTP judge; the critic joins later.
    dev = load_questions(workdir, "dev")[: s.agreement_questions]
    agree = {}
    if dev:
        agree["oracle"], _ = collect_ranking(policy, retriever, agent, judge, dev,
                                             dataclasses.replace(rc, outcome_threshold=-1.0, seed=config.seed + 1))
    if dev and s.rollout_m:
        agree["rollout"] = rollout_values(policy, retriever, agent, agree["oracle"], RolloutValueConfig(
            m=s.rollout_m, temperature=s.temperature, metric="em", max_steps=s.max_steps, k=config.index.k,
            batch_size=s.batch_size * s.n_candidates, max_new_tokens=s.max_new_tokens, seed=config.seed + 2))
    if dev and s.http_judge.get("base_url"):
        hj = get_judge("http", base_url=s.http_judge.base_url, model=s.http_judge.model)
        agree["http"] = judge_records(hj, agree["oracle"], kind="rank", source=f"rank:{hj.name}")
        stats["http_judge_failures"] = judge_failures(agree["http"])
        stats["http_judge_failed_states"] = stats["http_judge_failures"]["failed_states"]
    for source, recs in agree.items():
        write_records(out / "agreement" / f"records_{source}.jsonl", recs)
    stats["agreement_states"] = {k: len(v) for k, v in agree.items()}
    write_json(out / "stats.json", stats)
    log(name, f"{stats['states']} states ({stats['records_kept']} kept), {len(pairs)} pairs, "
              f"{stats['trajectories_kept']}/{stats['questions']} trajectories kept (F1 > {s.outcome_threshold}), "
              f"{stats['states_per_s']:.1f} states/s")
    if stats.get("http_judge_failed_states"):  # the last line of the stage: what the judge did not score, and why

        log(name, f"http judge {s.http_judge.model}: {failures_line(stats['http_judge_failures'])} of the dev "
                  f"agreement states; each candidate's failure is in {out / 'agreement' / 'records_http.jsonl'}")


# jaxrag.main checks the config before any stage runs
supervision_stage.check_config = checks.check_sampling
