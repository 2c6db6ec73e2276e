"""The dose-response study of the positive control (docs/demo.md, "A positive control"):

python -m jaxrag.main --config=configs/synthetic/dose.py --workdir=runs/dose          # p = 0, 0.25, 0.5, 1; seed 0
python -m jaxrag.main --config=configs/synthetic/dose.py:premature --workdir=runs/dose_premature  # EM-costing flaw
python -m jaxrag.main --config=configs/synthetic/dose.py:tiny --workdir=runs/dose_tiny  # p = 0, 1 on tiny (tests)

  dose_runs  every (p, seed) an ordinary run of pipeline.py:control with --config.teacher.p_vague_first=p into
             <workdir>/p<p>_seed<seed>/: the stages SFT, DPO, outcome RS and GRPO need, and their eval on
             the whole test split
  dose       <workdir>/dose/results.md, results.json, dose.png: per p the vague-query share and EM of each system,
             and each method's paired effect against SFT with its interval

--config.dose_runs.seeds='(0,1,2)' adds seeds (intervals then cover the seed spread); --config.dose_runs.doses sets p.
"""

from pathlib import Path

import ml_collections

P = "jaxrag.pipelines.synthetic"
STAGES = ("world", "index", "teacher", "tokenizer", "sft", "supervision", "dpo", "outcome", "grpo", "eval")
SYSTEMS = ("sft_react", "outcome_rs", "dpo", "grpo")
COMPARISONS = [
    ("dpo", "sft_react", "DPO on process pairs vs SFT"),
    ("outcome_rs", "sft_react", "outcome RS (SFT on own correct trajectories) vs SFT"),
    ("grpo", "sft_react", "GRPO (EM reward) vs SFT"),
]


def get_config(preset: str = "demo"):
    """preset: demo (the vague-first control at four doses, one seed) | premature (pipeline.py:control_premature:
    an answer before the last hop's search at p = 0.5, a flaw that costs EM) | tiny (the tiny pipeline at p = 0 and
    1, tests)."""
    if preset not in ("demo", "premature", "tiny"):
        raise ValueError(f"configs/synthetic/dose.py: unknown preset {preset!r} (demo | premature | tiny)")
    pipeline = Path(__file__).resolve().with_name("pipeline.py")
    c = ml_collections.ConfigDict()
    c.stages = ["dose_runs", "dose"]
    preset_of = {"demo": "control", "premature": "control_premature", "tiny": "tiny"}[preset]
    doses = {"demo": (0.0, 0.25, 0.5, 1.0), "premature": (0.5,), "tiny": (0.0, 1.0)}[preset]
    c.dose_runs = dict(fn=f"{P}.dose:dose_runs_stage", config=f"{pipeline}:{preset_of}",
                       knob="teacher.p_premature_last" if preset == "premature" else "teacher.p_vague_first",
                       doses=doses, seeds=(0,), stages=STAGES, eval_only=",".join(SYSTEMS),
                       # the whole test split (1,500 questions): a paired EM difference's MDE near 0.02 at one seed
                       flags="" if preset == "tiny" else "--config.eval.max_questions=0 --config.eval.splits=\"('test',)\"")
    c.dose = dict(fn=f"{P}.dose:dose_study_stage", runs="dose_runs", eval="eval", metrics=("vague", "em"),
                  comparisons=[dict(a=a, b=b, label=label) for a, b, label in COMPARISONS], level=0.95)
    return c
