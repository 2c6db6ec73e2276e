"""The dev-split trials behind results/synthetic_dev_tuning.md, on a copy of a `make demo` workdir (its sft reused):

python -m jaxrag.main --config=configs/synthetic/dev_tuning.py:a --workdir=runs/demo_copy --stages <the new stages>

Variants a (process supervision at T 0.5: DPO and critic), b and c (GRPO); every eval here is on the dev split only.
The main job's stages are pinned to their settings at commit effe013 (`as_tuned_from`), the demo these trials
started from, so its workdir's stages are reused and the baselines `dpo`, `critic`, `grpo` are that commit's.
"""
import importlib.util
from pathlib import Path

import ml_collections

spec = importlib.util.spec_from_file_location("pl", Path(__file__).with_name("pipeline.py"))
pl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pl)
P = "jaxrag.pipelines.synthetic"


def dpo(c, pairs, lr, beta=0.1, steps=150):
    d = ml_collections.ConfigDict(c.dpo.to_dict())
    d.pairs = pairs
    d.train.optimizer.lr = lr
    d.train.dpo.beta = beta
    d.train.steps = steps
    return d


def critic(c, pairs, lr=3e-4, steps=150):
    d = ml_collections.ConfigDict(c.critic.to_dict())
    d.pairs = pairs
    d.train.optimizer.lr = lr
    d.train.steps = steps
    return d


def grpo(c, lr, temperature, steps=30, q=8, g=4):
    d = pl.grpo_section(c)
    d.train.optimizer.lr = lr
    d.rl.update(dict(temperature=temperature, steps=steps, questions_per_step=q, group_size=g))
    return d


def ev(c, systems, n=200):
    e = ml_collections.ConfigDict(c.eval.to_dict())
    e.splits = ("dev",)
    e.max_questions = n
    e.systems = systems
    return e


def as_tuned_from(c) -> None:
    """The demo settings at effe013 that the chosen ones replaced (results/synthetic_dev_tuning.md)."""
    c.supervision.temperature = c.outcome.temperature = c.bestofn.temperature = 1.0
    c.dpo.train.optimizer.lr = 1e-4
    for system in c.eval.systems:
        if "temperature" in system:
            system["temperature"] = 1.0


def get_config(which: str = "a"):
    c = pl.get_config("demo")
    as_tuned_from(c)
    st = list(c.stages)
    if which == "a":  # process supervision at lower collection temperature
        c.supervision_t05 = ml_collections.ConfigDict(c.supervision.to_dict())
        c.supervision_t05.temperature = 0.5
        c.dpo_t05_lr3e5 = dpo(c, "supervision_t05", 3e-5)
        c.critic_t05 = critic(c, "supervision_t05")
        c.eval_dev_a = ev(c, [
            dict(name="sft_react", agent="react", model="sft"),
            dict(name="dpo_t1_lr1e4", agent="react", model="dpo"),
            dict(name="dpo_t05_lr3e5", agent="react", model="dpo_t05_lr3e5"),
            dict(name="sft_critic_t1_bo4_T05", agent="react", model="sft", critic="critic", n=4, temperature=0.5),
            dict(name="sft_critic_t05_bo4_T05", agent="react", model="sft", critic="critic_t05", n=4, temperature=0.5),
        ])
        new = ["supervision_t05", "dpo_t05_lr3e5", "critic_t05", "eval_dev_a"]
    elif which == "b":  # GRPO temperature / lr
        c.grpo_t05_lr2e4 = grpo(c, 2e-4, 0.5)
        c.eval_dev_b = ev(c, [
            dict(name="grpo_t1_lr5e5", agent="react", model="grpo"),
            dict(name="grpo_t05_lr2e4", agent="react", model="grpo_t05_lr2e4"),
        ])
        new = ["grpo_t05_lr2e4", "eval_dev_b"]
    elif which == "c":  # GRPO: bigger groups at T 0.7 (more groups with mixed outcomes), same 32 episodes/step
        c.grpo_t07_g8_lr1e4 = grpo(c, 1e-4, 0.7, q=4, g=8)
        c.eval_dev_c = ev(c, [dict(name="grpo_t07_g8_lr1e4", agent="react", model="grpo_t07_g8_lr1e4")])
        new = ["grpo_t07_g8_lr1e4", "eval_dev_c"]
    elif which == "d":  # the lr alone: DPO at 3e-5 on the T 1 pairs (separates the two knobs of trial a)
        c.dpo_t1_lr3e5 = dpo(c, "supervision", 3e-5)
        c.eval_dev_d = ev(c, [dict(name="dpo_t1_lr3e5", agent="react", model="dpo_t1_lr3e5")])
        new = ["dpo_t1_lr3e5", "eval_dev_d"]
    c.stages = st + new
    return c
