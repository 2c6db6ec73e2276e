"""Episode reward functions by name, for the RL loop and for scoring: `get_reward("em")(episode) -> Reward`.

A reward function maps a finished Episode to a total and its named components (logged per component by the RL
loop). `weighted({"em": 1.0, "arena": 0.5})` sums several. Registered here: em, f1, cem (outcome rewards). The
papers' shaped rewards (ARENA adaptive, SmartSearch composite) register themselves in the same table with
`register`.
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


def register(name: str):
    def deco(fn: RewardFn) -> RewardFn:
        if name in REWARDS:
            raise ValueError(f"reward {name!r} is registered twice")
        REWARDS[name] = fn
        return fn

    return deco


def _outcome(metric: str) -> RewardFn:
    def fn(ep: Episode) -> Reward:
        r = answer_reward(ep.answer, ep.gold, metric, ep.choices)
        return Reward(r, {metric: r})

    fn.__name__ = f"{metric}_reward"
    return fn


for _m in ("em", "f1", "cem"):
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


def get_reward(name: str) -> RewardFn:
    if name not in REWARDS:
        _load_papers_rewards()
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r} (known: {sorted(REWARDS)})")
    return REWARDS[name]


def weighted(weights: Mapping[str, float]) -> RewardFn:
    """Σ_name w · reward_name(episode); components keep every part's own components."""
    if not weights:
        raise ValueError("weighted(): no rewards given")
    fns = {name: get_reward(name) for name in weights}

    def fn(ep: Episode) -> Reward:
        total, comps = 0.0, {}
        for name, f in fns.items():
            r = f(ep)
            total += weights[name] * r.total
            comps.update({f"{name}/{k}" if k != name else k: v for k, v in r.components.items()})
        return Reward(total, comps)

    return fn


def reward_fn(spec: str | Mapping[str, float]) -> RewardFn:
    """A config value -> reward function: "em" | "em+0.5*arena" style string | {"em": 1.0, ...}."""
    if isinstance(spec, Mapping):
        return weighted(dict(spec))
    parts = [p.strip() for p in str(spec).split("+") if p.strip()]
    if len(parts) == 1 and "*" not in parts[0]:
        return get_reward(parts[0])
    weights = {}
    for p in parts:
        w, _, name = p.rpartition("*")
        weights[name.strip()] = float(w) if w else 1.0
    return weighted(weights)
