"""Settings as flat dotted keys, shared by the two checks that compare them: the trainer's refusal to resume under
changed settings (train.loop) and the stage fingerprints of a pipeline workdir (workdir)."""

from __future__ import annotations

# Keys (matched by their last dotted parts) that cannot change what a run writes: progress bars, log and checkpoint
# cadence, which checkpoint to resume from, the reference stage times behind a run's time estimates. Runs are
# deterministic under resume, so these may differ freely.
NEUTRAL = ("progress", "log_every", "checkpoint.every_steps", "checkpoint.keep", "checkpoint.async_save",
           "checkpoint.restore_step", "expected_seconds", "study_pairs")


def flatten(d, prefix: str = "") -> dict:
    """Nested dicts -> {dotted key: leaf}; tuples become lists (what a JSON round trip gives)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
    return out


# Keys added after runs were recorded without them, each with the value that does what their absence did: at that
# value a key reads as absent, so older workdirs keep their stage fingerprints and older checkpoints resume.
LATER = {"rl.continuous": False, "train_layout": "auto",   # train_layout: the same objective either way
         "loss_opts": {},   # a table loss has no options of its own
         "p_vague_first": 0.0, "p_premature_last": 0.0,   # the teacher's planted flaws, off
         "only": ""}   # the eval stage's system filter: all


def _match(key: str, name: str) -> bool:
    return key == name or key.endswith("." + name)


def is_neutral(key: str) -> bool:
    return any(_match(key, n) for n in NEUTRAL)


def as_before(key: str, value) -> bool:
    """`key` is a LATER key at the value its absence meant."""
    return any(_match(key, n) and value == v for n, v in LATER.items())


def changed_keys(old: dict, new: dict, ignore=()) -> list[str]:
    """Dotted keys whose values differ between two nested settings dicts, `ignore`d keys left out (a LATER key at
    its old meaning and an absent one are the same)."""
    a, b = ({k: v for k, v in flatten(d).items() if not as_before(k, v)} for d in (old, new))
    return sorted(k for k in set(a) | set(b) if k not in ignore and a.get(k) != b.get(k))
