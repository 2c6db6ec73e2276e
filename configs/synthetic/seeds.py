"""The seeds study: the demo's systems over several seeds on one fixed world (docs/studies_seeds.md).

python -m jaxrag.main --config=configs/synthetic/seeds.py --workdir=runs/seeds          # 3 seeds of the demo
python -m jaxrag.main --config=configs/synthetic/seeds.py:tiny --workdir=runs/seeds_tiny  # 2 seeds of tiny (tests)

  seed_runs  every seed an ordinary run of configs/synthetic/pipeline.py[:preset] with --config.seed=<s> into
             <workdir>/seed_<s>/ (seed: SFT init, data order, sampling; world_seed fixed)
  seeds      <workdir>/seeds/results.md, results.json, seeds.png: EM and F1 mean +/- SE over seeds per system and
             split, and a paired bootstrap interval of each comparison below (over seeds and questions)

--config.seed_runs.seeds='(0,1,2,3,4)' runs more seeds; a finished seed's stages are skipped on a rerun.
"""

from pathlib import Path

import ml_collections

P = "jaxrag.pipelines.synthetic"


def comparisons(n: int) -> list[tuple[str, str, str]]:
    """The comparisons the papers make, as (a, b, label): a - b is reported. bo<N>_<selector> are the best-of-N
    stage's runs (test split): the critic's pick among n candidates per step vs the first valid one, and vs greedy
    N = 1."""
    return [
        ("dpo", "outcome_rs", "process vs outcome supervision at equal samples (DPO on ranking pairs vs rejection "
                              "sampling)"),
        ("dpo", "sft_react", "DPO vs SFT"),
        (f"bo{n}_critic", f"bo{n}_first_valid", f"critic best-of-{n} vs the first valid of {n}"),
        (f"bo{n}_critic", "bo1_critic", f"critic best-of-{n} vs N = 1 (greedy)"),
        ("sft_critic_bo4", "sft_react", "SFT + critic best-of-4 vs SFT (eval splits)"),
        ("grpo", "sft_react", "GRPO (EM reward) vs SFT"),
        ("grpo_f1_penalty", "grpo", "F1 - search penalty (Search-R1++) vs EM reward, same RL budget"),
        ("grpo_f1_penalty", "dpo", "F1 - search penalty RL vs DPO (outcome RL vs process supervision)"),
    ]


def get_config(preset: str = "demo"):
    if preset not in ("demo", "tiny"):
        raise ValueError(f"configs/synthetic/seeds.py: unknown preset {preset!r} (demo | tiny)")
    c = ml_collections.ConfigDict()
    c.stages = ["seed_runs", "seeds"]
    pipeline = Path(__file__).resolve().with_name("pipeline.py")
    c.seed_runs = dict(fn=f"{P}.seeds:seed_runs_stage", config=f"{pipeline}:{preset}",
                       seeds=(0, 1, 2) if preset == "demo" else (0, 1), stages=(), flags="")
    n = 4 if preset == "demo" else 2  # best-of-N's N (the tiny pipeline's bestofn runs N = 1, 2)
    c.seeds = dict(fn=f"{P}.seeds:seeds_study_stage", runs="seed_runs", eval="eval", bestofn="bestofn",
                   comparisons=[dict(a=a, b=b, label=label) for a, b, label in comparisons(n)], n_boot=10_000,
                   level=0.95)
    return c
