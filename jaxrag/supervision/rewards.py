"""Episode reward functions by name, for the RL loop and for scoring: `get_reward("em")(episode) -> Reward`.

A reward function maps a finished Episode to a total and its named components (logged per component by the RL
loop). `weighted({"em": 1.0, "arena": 0.5})` sums several. Registered here: em, f1, cem, acc (outcome rewards) and
f1_search_penalty (the outcome baseline of Search-R1++: F1 minus a cost per search). The papers' shaped rewards
(ARENA adaptive, SmartSearch composite) register themselves in the same table with `register`.

A reward with numeric settings registers a factory with `register_parametric`; a spec names its settings in
parentheses, "f1_search_penalty(0.05)" or "f1_search_penalty(0.05, -1)", and the bare name takes the defaults.

A reward that asks an LLM judge about the answer (ARENA's LJ accuracy) registers a factory with `register_judged`:
judge -> reward function; `get_reward(name, answer_judge=...)` builds it, and names the missing judge otherwise. A
reward function may have a `prepare(episodes)` attribute: the RL loop calls it once per batch before scoring
(a judged reward sends its judge calls there, several at a time).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Mapping

from jaxrag.env.mdp import Episode, answer_reward


@dataclasses.dataclass(frozen=True)
class Reward:
    total: float
    components: dict  # name -> float


RewardFn = Callable[[Episode], Reward]
REWARDS: dict[str, RewardFn] = {}
JUDGED: dict[str, Callable[[object], RewardFn]] = {}   # name -> (answer judge -> reward function)
PARAMETRIC: dict[str, Callable[..., RewardFn]] = {}   # name -> (numeric settings -> reward function)


def _register(table: dict, name: str):
    def deco(fn):
        if name in REWARDS or name in JUDGED or name in PARAMETRIC:
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


def register_parametric(name: str):
    """Register a factory (*floats) -> RewardFn; the spec "name(a, b)" calls it with (a, b), "name" with none."""
    return _register(PARAMETRIC, name)


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


@register_parametric("f1_search_penalty")
def f1_search_penalty(penalty: float = 0.05, floor: float = 0.0) -> RewardFn:
    """Search-R1++'s outcome reward: max(floor, F1(answer, gold) - penalty x searches).

    F1 gives partial credit where EM gives none; the cost per search keeps the policy from searching its way around
    answering (the paper's "answer avoidance" under a plain F1 reward). The floor keeps a wrong answer's reward at
    `floor` however many searches it made, so the penalty only orders the trajectories that earned something."""
    if penalty < 0:
        raise ValueError(f"f1_search_penalty: penalty {penalty} < 0 would reward searching")

    def fn(ep: Episode) -> Reward:
        f1 = answer_reward(ep.answer, ep.gold, "f1", ep.choices)
        n = ep.num_searches
        return Reward(max(floor, f1 - penalty * n), {"f1": f1, "searches": float(n)})

    fn.__name__ = f"f1_search_penalty_{penalty:g}_{floor:g}"
    return fn


def _load_papers_rewards() -> None:
    """Import the modules whose rewards register themselves (kept lazy: they import more of the package)."""
    for mod in ("jaxrag.supervision.arena_reward", "jaxrag.supervision.smartsearch"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


def _parametric(spec: str):
    """"name(a, b)" -> (name, (a, b)); a bare name -> (name, None)."""
    spec = spec.strip()
    if not spec.endswith(")") or "(" not in spec:
        return spec, None
    name, _, args = spec[:-1].partition("(")
    try:
        values = tuple(float(a) for a in args.split(",") if a.strip())
    except ValueError:
        raise ValueError(f"reward {spec!r}: the settings in parentheses must be numbers") from None
    return name.strip(), values


def get_reward(name: str, answer_judge=None) -> RewardFn:
    """The reward called `name`; a judged one (register_judged) is built around `answer_judge`, a parametric one
    (register_parametric) from the numbers in "name(a, b)"."""
    name, args = _parametric(name)
    if name in PARAMETRIC:
        try:
            return PARAMETRIC[name](*(args or ()))
        except TypeError as e:
            raise ValueError(f"reward {name}{tuple(args or ())}: {e}") from None
    if args is not None:
        raise ValueError(f"reward {name!r} takes no settings in parentheses (parametric: {sorted(PARAMETRIC)})")
    if name not in REWARDS and name not in JUDGED:
        _load_papers_rewards()
    if name in JUDGED:
        if answer_judge is None:
            raise ValueError(f"reward {name!r} asks an LLM judge about every answer: set the stage's "
                             "answer_judge.base_url (an OpenAI-compatible endpoint)")
        return JUDGED[name](answer_judge)
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r} (known: {sorted(REWARDS) + sorted(JUDGED) + sorted(PARAMETRIC)})")
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
