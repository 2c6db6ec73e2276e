"""Episode reward functions by name, for the RL loop and for scoring: `get_reward("em")(episode) -> Reward`.

A reward function maps a finished Episode to a total and its named components (logged per component by the RL
loop). `weighted({"em": 1.0, "arena": 0.5})` sums several. Registered here: em, f1, cem, acc (outcome rewards). The
papers' shaped rewards (ARENA adaptive, SmartSearch composite) register themselves in the same table with
`register`.

A reward that asks an LLM judge about the answer (ARENA's LJ accuracy) registers a factory with `register_judged`:
judge -> reward function; `get_reward(name, answer_judge=...)` builds it, and names the missing judge otherwise. A
reward function may have a `prepare(episodes)` attribute: the RL loop calls it once per batch before scoring
(a judged reward sends its judge calls there, several at a time).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

from jaxrag.env.mdp import Episode, answer_reward


@dataclasses.dataclass(frozen=True)
class Reward:
    total: float
    components: dict  # name -> float


RewardFn = Callable[[Episode], Reward]
REWARDS: dict[str, RewardFn] = {}
JUDGED: dict[str, Callable[[object], RewardFn]] = {}   # name -> (answer judge -> reward function)


def _register(table: dict, name: str):
    def deco(fn):
        if name in REWARDS or name in JUDGED:
            raise ValueError(f"reward {name!r} is registered twice")
        table[name] = fn
        return fn

    return deco


def register(name: str):
    """Register a reward function Episode -> Reward under `name`."""
    return _register(REWARDS, name)


def register_judged(name: str):
    """Register a factory judge -> RewardFn (the judge: jaxrag.judge.OpenAIJudge or anything with judge_answers)."""
    return _register(JUDGED, name)


def prepare(reward, episodes) -> None:
    """Run `reward.prepare(episodes)` where the reward has one."""
    fn = getattr(reward, "prepare", None)
    if fn is not None:
        fn(episodes)


def _outcome(metric: str) -> RewardFn:
    def fn(ep: Episode) -> Reward:
        r = answer_reward(ep.answer, ep.gold, metric, ep.choices)
        return Reward(r, {metric: r})

    fn.__name__ = f"{metric}_reward"
    return fn


for _m in ("em", "f1", "cem", "acc"):
    register(_m)(_outcome(_m))


def _load_papers_rewards() -> None:
    """Import the modules whose rewards register themselves (kept lazy: they import more of the package)."""
    import importlib

    for mod in ("jaxrag.supervision.arena_reward", "jaxrag.supervision.smartsearch"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


def get_reward(name: str, answer_judge=None) -> RewardFn:
    """The reward called `name`; a judged one (register_judged) is built around `answer_judge`."""
    if name not in REWARDS and name not in JUDGED:
        _load_papers_rewards()
    if name in JUDGED:
        if answer_judge is None:
            raise ValueError(f"reward {name!r} asks an LLM judge about every answer: set the stage's "
                             "answer_judge.base_url (an OpenAI-compatible endpoint)")
        return JUDGED[name](answer_judge)
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r} (known: {sorted(REWARDS) + sorted(JUDGED)})")
    return REWARDS[name]


def weighted(weights: Mapping[str, float], answer_judge=None) -> RewardFn:
    """Σ_name w · reward_name(episode); components keep every part's own components."""
    if not weights:
        raise ValueError("weighted(): no rewards given")
    fns = {name: get_reward(name, answer_judge) for name in weights}

    def fn(ep: Episode) -> Reward:
        total, comps = 0.0, {}
        for name, f in fns.items():
            r = f(ep)
            total += weights[name] * r.total
            comps.update({f"{name}/{k}" if k != name else k: v for k, v in r.components.items()})
        return Reward(total, comps)

    def prepare_parts(episodes):
        for f in fns.values():
            prepare(f, episodes)

    fn.prepare = prepare_parts
    return fn


def reward_fn(spec: str | Mapping[str, float], answer_judge=None) -> RewardFn:
    """A config value -> reward function: "em" | "em+0.5*arena" style string | {"em": 1.0, ...}. answer_judge: the
    judge of the judged rewards among them."""
    if isinstance(spec, Mapping):
        return weighted(dict(spec), answer_judge)
    parts = [p.strip() for p in str(spec).split("+") if p.strip()]
    if len(parts) == 1 and "*" not in parts[0]:
        return get_reward(parts[0], answer_judge)
    weights = {}
    for p in parts:
        w, _, name = p.rpartition("*")
        weights[name.strip()] = float(w) if w else 1.0
    return weighted(weights, answer_judge)
