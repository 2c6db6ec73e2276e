"""The dev-split trials behind results/synthetic_dev_tuning.md, on a copy of a `make demo` workdir (its sft reused):

python -m jaxrag.main --config=configs/synthetic/dev_tuning.py:a --workdir=runs/demo_copy --stages <the new stages>

Variants a (process supervision at T 0.5: DPO and critic), b and c (GRPO), d (DPO lr), e and f (the critic), g and
h (GRPO from the demo with the unseen pool), i (the SFT schedule); every eval here is on the dev split only. Every
variant's `sft` and `grpo` are the demo's before trials i and h (`sft_before_i`, `grpo_before_h`).
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
    d.questions.path = c.grpo.questions.path  # the demo grpo's (pool_off: every train question)
    d.train.optimizer.lr = lr
    d.rl.update(dict(temperature=temperature, steps=steps, questions_per_step=q, group_size=g))
    return d


def ev(c, systems, n=200):
    e = ml_collections.ConfigDict(c.eval.to_dict())
    e.splits = ("dev",)
    e.max_questions = n
    e.systems = systems
    return e


def pool_off(c) -> None:
    """Trials a to f ran before the unseen pool: SFT on every train question, GRPO sampling from all of them."""
    del c["unseen_questions"]
    c.grpo.questions.path = "world/questions_train.jsonl"


def sft_wsd(steps):
    """The demo's SFT (read afresh: get_config pins `sft` to the old one) at `steps` on the warmup-stable-decay
    schedule (the last 20 % decaying), eval every 60."""
    d = pl.get_config("demo").sft
    d.train.steps = steps
    d.eval_every = 60
    return d


def sft_before_i(c) -> None:
    """The demo's SFT before trial i chose 720 steps on the warmup-stable-decay schedule: every trial here ran from
    a workdir whose sft had 900 steps on the cosine."""
    c.sft.eval_every = 150
    c.sft.train.steps = 900
    c.sft.train.optimizer.schedule = "cosine"


def grpo_before_h(c) -> None:
    """The demo's GRPO before trials g and h chose T 0.7, G 8, lr 1e-4: the baseline `grpo` of every trial here."""
    c.grpo.rl.update(dict(temperature=1.0, questions_per_step=8, group_size=4))
    c.grpo.train.optimizer.lr = 5e-5


def as_tuned_from(c) -> None:
    """The demo settings at effe013 that the chosen ones replaced (results/synthetic_dev_tuning.md)."""
    pool_off(c)
    c.supervision.temperature = c.outcome.temperature = c.bestofn.temperature = 1.0
    c.dpo.train.optimizer.lr = 1e-4
    for system in c.eval.systems:
        if "temperature" in system:
            system["temperature"] = 1.0


def agreement(critic_stage, records):
    return ml_collections.ConfigDict(dict(fn=f"{P}.analysis:agreement_stage", records=records, critic=critic_stage,
                                          agent="react"))


TRIALS = "abcdeghi"   # f is part of e (a diagnostic on its pairs)


def get_config(which: str = "a"):
    if len(which) != 1 or which not in TRIALS:
        raise ValueError(f"configs/synthetic/dev_tuning.py: unknown trial {which!r} (one of {', '.join(TRIALS)})")
    c = pl.get_config("demo")
    sft_before_i(c)
    grpo_before_h(c)
    if which in ("a", "b", "c", "d"):
        as_tuned_from(c)
    elif which in ("e", "f"):  # from the demo at 459de0f (its T 0.5 settings; SFT on every train question)
        pool_off(c)
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
    elif which == "e":  # the critic (from the demo at 459de0f, T 0.5 settings): more pairs, lower lr
        c.supervision_big = ml_collections.ConfigDict(c.supervision.to_dict())
        c.supervision_big.update(dict(max_questions=1200, agreement_questions=200, rollout_m=0))
        trials = {"critic_lr1e4": ("supervision", 1e-4), "critic_big": ("supervision_big", 3e-4),
                  "critic_big_lr1e4": ("supervision_big", 1e-4)}
        new = ["supervision_big"]
        for t, (pairs, lr) in trials.items():
            c[t] = critic(c, pairs, lr)
            new.append(t)
        for t in ["critic", *trials]:  # agreement with the oracle on 200 dev questions' states
            c[f"agree_{t}"] = agreement(t, "supervision_big")
            new.append(f"agree_{t}")
        c.eval_dev_e = ev(c, [dict(name=f"sft_{t}_bo4", agent="react", model="sft", critic=t, n=4, temperature=0.5)
                              for t in ["critic", *trials]])
        new.append("eval_dev_e")
        # f (a diagnostic): pairs collected on dev[300:1500], questions the SFT policy never trained on, written as
        # workdir/supervision_dev by a script (results/synthetic_dev_tuning.md); agreement on dev[:200] as in e
        c.supervision_dev = ml_collections.ConfigDict(c.supervision.to_dict())  # placeholder: made by the script
        c.critic_devpairs = critic(c, "supervision_dev", 3e-4)
        c.agree_critic_devpairs = agreement("critic_devpairs", "supervision_big")
        c.supervision_dev300 = ml_collections.ConfigDict(c.supervision.to_dict())  # dev[300:600]'s pairs of it
        c.critic_devpairs300 = critic(c, "supervision_dev300", 3e-4)
        c.agree_critic_devpairs300 = agreement("critic_devpairs300", "supervision_big")
        new += ["supervision_dev", "critic_devpairs", "agree_critic_devpairs", "supervision_dev300",
                "critic_devpairs300", "agree_critic_devpairs300"]
    elif which == "g":  # GRPO from today's demo (the unseen pool): G 8 at T 0.7 (more mixed groups), twice the steps
        c.grpo_t07_g8_60 = grpo(c, 1e-4, 0.7, steps=60, q=4, g=8)
        c.eval_dev_g = ev(c, [dict(name="sft_react", agent="react", model="sft"),
                              dict(name="grpo", agent="react", model="grpo"),
                              dict(name="grpo_t07_g8_60", agent="react", model="grpo_t07_g8_60")])
        new = ["grpo_t07_g8_60", "eval_dev_g"]
    elif which == "h":  # trial g's sampling at the demo's 30 steps (no extra time): lr 1e-4 and 2e-4
        c.grpo_t07_g8_30 = grpo(c, 1e-4, 0.7, steps=30, q=4, g=8)
        c.grpo_t07_g8_30_lr2e4 = grpo(c, 2e-4, 0.7, steps=30, q=4, g=8)
        c.eval_dev_h = ev(c, [dict(name="sft_react", agent="react", model="sft"),
                              dict(name="grpo_t07_g8_30", agent="react", model="grpo_t07_g8_30"),
                              dict(name="grpo_t07_g8_30_lr2e4", agent="react", model="grpo_t07_g8_30_lr2e4")])
        new = ["grpo_t07_g8_30", "grpo_t07_g8_30_lr2e4", "eval_dev_h"]
    elif which == "i":  # SFT: fewer steps on a warmup-stable-decay schedule (the cost of the main job)
        c.sft_wsd720, c.sft_wsd600 = sft_wsd(720), sft_wsd(600)
        c.eval_dev_i = ev(c, [dict(name="sft_react", agent="react", model="sft"),
                              dict(name="sft_wsd720", agent="react", model="sft_wsd720"),
                              dict(name="sft_wsd600", agent="react", model="sft_wsd600")])
        new = ["sft_wsd720", "sft_wsd600", "eval_dev_i"]
    c.stages = st + new
    return c
