"""Static checks of the synthetic pipeline's config, run by jaxrag.main before any stage starts (a stage function's
`check_config`): a typo in a stage reference, agent or split name fails at once, naming the key, not after the
stages before it have trained for a quarter of an hour."""

from __future__ import annotations

from jaxrag.env.agents import agent_module
from jaxrag.pipelines.common import config_fail

# keys of a stage's section whose (non-empty) value names an earlier stage of the same config
STAGE_REFS = ("policy", "init", "init_from", "critic", "records", "pairs", "budget_from", "data", "eval",
              "eval_findings")
SPLITS = ("train", "dev", "test", "heldout")


def _stage_ref(config, name: str, key: str, value) -> None:
    stages = list(config.stages)
    if value not in stages:
        config_fail(key, f"{value!r} is not a stage of this config (stages: {', '.join(stages)})")
    if name in stages and stages.index(value) >= stages.index(name):
        config_fail(key, f"stage {value!r} runs after {name!r}, so its outputs are not there yet")


def _agent(key: str, value) -> None:
    try:
        agent_module(value)
    except KeyError as e:
        config_fail(key, e.args[0])


SAMPLER_KEYS = ("min_rows", "min_prompt")   # the optional `sampler` section: world.stage_policy's shape floors


def _sampler(config) -> None:
    for key, value in dict(config.get("sampler") or {}).items():
        if key not in SAMPLER_KEYS:
            config_fail(f"sampler.{key}", f"unknown key (known: {', '.join(SAMPLER_KEYS)})")
        if not isinstance(value, int) or value < 1:
            config_fail(f"sampler.{key}", f"{value!r} must be an integer >= 1")


def check_stage(config, name: str) -> None:
    """Every stage reference names an earlier stage; the agent, if any, is a known one; the optional `sampler`
    section has only known keys with positive integer values."""
    _sampler(config)
    s = config[name]
    for key in STAGE_REFS:
        value = s.get(key)
        if isinstance(value, str) and value:
            _stage_ref(config, name, f"{name}.{key}", value)
    if isinstance(s.get("agent"), str):
        _agent(f"{name}.agent", s.agent)


def check_sampling(config, name: str) -> None:
    """check_stage, and a stage that samples train questions draws them from the unseen pool when there is one:
    max_questions (its seeded subset, the head of the pool's order) must fit in config.unseen_questions."""
    check_stage(config, name)
    pool, n = int(config.get("unseen_questions", 0)), int(config[name].get("max_questions", 0))
    if pool and not 0 < n <= pool:
        config_fail(f"{name}.max_questions", f"{n}{' (all)' if n == 0 else ''} would sample train questions SFT "
                    f"trained on: at most unseen_questions={pool} (raise it, or set it to 0 to sample any)")


def check_eval(config, name: str) -> None:
    """The eval stage's systems: unique names, known agents, models and critics that are earlier stages, n >= 1;
    splits among the world's."""
    check_stage(config, name)
    s = config[name]
    for i, split in enumerate(s.splits):
        if split not in SPLITS:
            config_fail(f"{name}.splits[{i}]", f"unknown split {split!r} (known: {', '.join(SPLITS)})")
    seen = set()
    for i, system in enumerate(s.systems):
        where = f"{name}.systems[{i}]"
        for key in ("name", "agent", "model"):
            if not system.get(key):
                config_fail(where, f"missing {key!r}")
        if system["name"] in seen:
            config_fail(where, f"duplicate system name {system['name']!r}")
        seen.add(system["name"])
        _agent(f"{where}.agent", system["agent"])
        _stage_ref(config, name, f"{where}.model", system["model"])
        if system.get("critic"):
            _stage_ref(config, name, f"{where}.critic", system["critic"])
            if int(system.get("n", 0)) < 1:
                config_fail(f"{where}.n", "a critic system needs n >= 1 candidates")
    for x in [x.strip() for x in str(s.get("only") or "").split(",") if x.strip()]:
        if x not in seen:
            config_fail(f"{name}.only", f"{x!r} is not one of the systems ({', '.join(sorted(seen))})")
