"""An ablation as one line of a config file: a stage section copied under a new name with overrides.

    c = pipeline.get_config(preset)
    variant(c, "dpo", "simpo", **{"train.loss": "my_losses:simpo"})

The new stage runs right after its base with the base's settings but the overrides (dotted keys); it keeps the
base's references (`seed` for its data order and sampling, `index.k` for an RL section's documents per search), so
--config.seed reaches it as it reaches the base. Where the base's model is an eval system (a ReAct system without a
critic), the new model is evaluated beside it under the variant's name, and the pair (variant, base) joins
`c.study_pairs` (result-neutral: no stage's outputs depend on it), which the seeds study reads from its seeds' runs,
so its paired interval is reported with the others.
"""

import ml_collections


def variant(c: ml_collections.ConfigDict, base: str, name: str, *, label: str = "", **overrides):
    """Add stage `name` to config `c` (in place): section `base` with `overrides`; returns the new section."""
    if base not in c or base not in c.stages:
        raise ValueError(f"variant: {base!r} is not a stage of this config (stages: {', '.join(c.stages)})")
    if name in c or name in c.stages:
        raise ValueError(f"variant: {name!r} is already a key of this config; choose another name")
    section = ml_collections.ConfigDict(c[base].to_dict())
    section.lock()   # an override names an existing key: a typo fails here instead of adding a key
    try:
        section.update_from_flattened_dict(dict(overrides))
    except (KeyError, AttributeError) as e:
        raise ValueError(f"variant {name!r}: override {e} is not a key of section {base!r}") from None
    section.unlock()
    with c.unlocked():
        c[name] = section
    if "train" in section and "seed" in section.train:
        c[name].train.seed = c.get_ref("seed")
    if "rl" in section:
        c[name].rl.seed = c.get_ref("seed")
        if "index" in c:
            c[name].rl.k = c.index.get_ref("k")
    stages = list(c.stages)
    stages.insert(stages.index(base) + 1, name)
    c.stages = stages
    systems = [dict(s) for s in c.get("eval", {}).get("systems", [])]
    twin = next((s for s in systems if s.get("model") == base and s.get("agent") == "react" and not s.get("critic")),
                None)
    if twin is not None:
        c.eval.systems = systems + [{**twin, "name": name, "model": name}]
        pairs = list(c.get("study_pairs", []))
        pairs.append({"a": name, "b": twin["name"], "label": label or f"{name} vs {twin['name']} (variant of {base})"})
        c.study_pairs = pairs
    return c[name]
