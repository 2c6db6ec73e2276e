"""Settings as flat dotted keys, shared by the two checks that compare them: the trainer's refusal to resume under
changed settings (train.loop) and the stage fingerprints of a pipeline workdir (workdir)."""

from __future__ import annotations

# Keys (matched by their last dotted parts) that cannot change what a run writes: progress bars, log and checkpoint
# cadence, which checkpoint to resume from. Runs are deterministic under resume, so these may differ freely.
NEUTRAL = ("progress", "log_every", "checkpoint.every_steps", "checkpoint.keep", "checkpoint.async_save",
           "checkpoint.restore_step")


def flatten(d, prefix: str = "") -> dict:
    """Nested dicts -> {dotted key: leaf}; tuples become lists (what a JSON round trip gives)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
    return out


def is_neutral(key: str) -> bool:
    return any(key == n or key.endswith("." + n) for n in NEUTRAL)


def changed_keys(old: dict, new: dict, ignore=()) -> list[str]:
    """Dotted keys whose values differ between two nested settings dicts, `ignore`d keys left out."""
    a, b = flatten(old), flatten(new)
    return sorted(k for k in set(a) | set(b) if k not in ignore and a.get(k) != b.get(k))
