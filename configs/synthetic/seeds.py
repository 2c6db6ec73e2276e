"""The seeds study: the demo's systems over several seeds on one fixed world (docs/studies_seeds.md).

python -m jaxrag.main --config=configs/synthetic/seeds.py --workdir=runs/seeds          # 3 seeds of the demo
python -m jaxrag.main --config=configs/synthetic/seeds.py:tiny --workdir=runs/seeds_tiny  # 2 seeds of tiny (tests)
python -m jaxrag.main --config=configs/synthetic/seeds.py:findings --workdir=runs/seeds  # + the findings' pairs

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
    """The comparisons the papers make, as (a, b, label): a - b is reported (a variant's pairing with its base, such
    as grpo_f1_penalty vs grpo, comes from the seeds' own config: seeds.comparisons_of). bo<N>_<selector> are the best-of-N
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
        ("grpo_f1_penalty", "dpo", "F1 - search penalty RL vs DPO (outcome RL vs process supervision)"),
    ]


# findings.py:paired's systems (its eval_findings stage)
FINDINGS = [
    ("dpo_mcts", "dpo", "MCTS-SPRE pairs vs ranking pairs (DPO, equal sampled actions)"),
    ("grpo_k3", "grpo", "GRPO with the k3 KL estimator vs k2 (ARENA), same budget"),
    ("ss_grpo", "sft_react", "SmartSearch curriculum (SFT -> DPO -> GRPO) vs SFT"),
    ("ss_sft", "sft_react", "SmartSearch stage 1 (SFT on credited, refined data) vs SFT"),
]


def get_config(preset: str = "demo"):
    """preset: demo (the demo's systems, 3 seeds) | findings (the same and findings.py:paired's: MCTS pairs, k3,
    SmartSearch's curriculum; a demo study's seed runs in the workdir are reused) | control (the demo's systems on
    pipeline.py:control, the positive control) | tiny (2 seeds, tests)."""
    if preset not in ("demo", "findings", "control", "tiny"):
        raise ValueError(f"configs/synthetic/seeds.py: unknown preset {preset!r} (demo | findings | control | tiny)")
    here = Path(__file__).resolve()
    c = ml_collections.ConfigDict()
    c.stages = ["seed_runs", "seeds"]
    config = f"{here.with_name('findings.py')}:paired" if preset == "findings" else \
        f"{here.with_name('pipeline.py')}:{preset}"
    c.seed_runs = dict(fn=f"{P}.seeds:seed_runs_stage", config=config,
                       seeds=(0, 1) if preset == "tiny" else (0, 1, 2), stages=(), flags="")
    n = 2 if preset == "tiny" else 4  # best-of-N's N (the tiny pipeline's bestofn runs N = 1, 2)
    pairs = comparisons(n) + (FINDINGS if preset == "findings" else [])
    c.seeds = dict(fn=f"{P}.seeds:seeds_study_stage", runs="seed_runs",
                   eval="eval,eval_findings" if preset == "findings" else "eval", bestofn="bestofn",
                   comparisons=[dict(a=a, b=b, label=label) for a, b, label in pairs], n_boot=10_000, level=0.95,
                   # the control's planted flaw is a vague query: its comparisons difference that share too
                   metrics=("em", "vague") if preset == "control" else ("em",))
    return c
