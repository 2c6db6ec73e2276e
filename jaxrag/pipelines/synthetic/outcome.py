"""The outcome-supervision baseline at equal sampled data: rejection sampling (SFT on the policy's own correct
trajectories), so that "process beats outcome supervision" is tested, not assumed.

config[name]: policy (the stage whose model samples and is fine-tuned), budget_from (the supervision stage: its
stats.json says how many actions it sampled; this stage samples as many, in whole trajectories), agent,
max_questions (the same seeded train subset as the supervision stage), keep_f1 (a trajectory is kept when its
answer's F1 >= keep_f1; 1.0 = exactly right), temperature, max_steps, batch_size,
max_new_tokens, max_len, and `train` (loss "sft"). Outputs: episodes.jsonl, model/, metrics.jsonl, summary.json.
"""

from __future__ import annotations

from pathlib import Path

from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import write_episodes
from jaxrag.env.rollout import rollout
from jaxrag.metrics import f1_score
from jaxrag.pipelines.common import read_json
from jaxrag.pipelines.synthetic import checks
from jaxrag.pipelines.synthetic.sft import sft_on_episodes
from jaxrag.pipelines.synthetic.supervise import sampling_setup
from jaxrag.pipelines.synthetic.world import rollout_config
from jaxrag.train.distributed import from_lead


def outcome_stage(config, workdir, name) -> None:
    s = config[name]
    budget = int(read_json(Path(workdir) / s.budget_from / "stats.json")["sampled_actions_all"])
    # multi-host: process 0 samples (one stream, as on one process) and writes episodes.jsonl; every process then
    # trains on the same episodes
    episodes, sampled, rounds = from_lead(lambda: sample_budget(config, workdir, name, budget), f"{workdir}:{name}")
    correct = [e for e in episodes if f1_score(e.answer, e.gold) >= s.keep_f1]
    if not correct:
        raise ValueError(f"{name}: none of {len(episodes)} sampled trajectories is correct; nothing to train on")
    sft_on_episodes(workdir, name, correct, get_agent(s.agent, mode="plain"), s.policy, s.max_len, s.train,
                    {"budget_actions": budget, "sampled_actions": sampled, "trajectories": len(episodes),
                     "correct": len(correct), "rounds": rounds})


def sample_budget(config, workdir, name, budget: int) -> tuple[list, int, int]:
    """Whole trajectories from the policy until `budget` actions are sampled (at most 100 rounds over the
    questions, each with its own seed); writes them to episodes.jsonl. -> (episodes, actions sampled, rounds)."""
    s, out, retriever, agent, policy, questions = sampling_setup(config, workdir, name)
    episodes, sampled, rounds = [], 0, 0
    while sampled < budget and rounds < 100:
        rc = rollout_config(config, s, temperature=s.temperature, seed=config.seed + 7919 * (rounds + 1),
                            progress=True)
        for ep in rollout(policy, retriever, agent, questions, rc):
            if sampled >= budget:
                break
            episodes.append(ep)
            sampled += len(ep.steps)
        rounds += 1
    write_episodes(out / "episodes.jsonl", episodes)
    return episodes, sampled, rounds


# jaxrag.main checks the config before any stage runs
outcome_stage.check_config = checks.check_sampling
