"""SIGTERM, how schedulers and TPU VMs preempt a job, as a request to stop at the next step boundary.

`install()` (jaxrag.main) replaces SIGTERM's default end. Inside a training loop (between `arm()` and `disarm()`)
the signal sets a flag: the loop asks `requested()` after each step, true on every process once any process got the signal (one tiny all-gather
per step when there are several), so all of them save that step's checkpoint and raise Preempted together, and a rerun
of the same command resumes from it. Outside a loop the signal raises Preempted at once, as Ctrl-C raises
KeyboardInterrupt; a signal that came during a loop's last step stops the run before the next stage (`check()`).
"""

from __future__ import annotations

import signal

import jax
import numpy as np
from jax.experimental import multihost_utils

_FLAG = {"set": False, "installed": False, "armed": 0}


class Preempted(Exception):
    """The run stopped on SIGTERM; `saved`: the checkpoint it saved for the rerun to resume from, or None."""

    def __init__(self, message: str, saved=None):
        super().__init__(message)
        self.saved = saved


def _handler(signum, frame) -> None:
    _FLAG["set"] = True
    if not _FLAG["armed"]:
        raise Preempted("stopped by SIGTERM")


def arm() -> None:
    """A training loop starts its steps: SIGTERM now waits for a step boundary, where the loop asks requested()."""
    _FLAG["armed"] += 1


def disarm() -> None:
    """The loop ended (its `finally`): SIGTERM stops the process at once again."""
    _FLAG["armed"] -= 1


def check() -> None:
    """Raise Preempted if a SIGTERM came while a loop could not stop for it (during its last step)."""
    if _FLAG["set"]:
        raise Preempted("stopped by SIGTERM")


def install() -> None:
    """SIGTERM sets the flag (main thread only, as Python's signal module requires)."""
    signal.signal(signal.SIGTERM, _handler)
    _FLAG["installed"] = True


def requested() -> bool:
    """True once this process or any other got SIGTERM (checked together: every process calls this at the same
    step)."""
    if not _FLAG["installed"]:
        return False

    if jax.process_count() == 1:
        return _FLAG["set"]

    return bool(np.max(multihost_utils.process_allgather(np.int32(_FLAG["set"]))))


def stop(ckpt, step: int, state, meta: dict) -> None:
    """Save `step`'s checkpoint (unless it is the latest already) and raise Preempted naming it."""
    if ckpt is None:
        raise Preempted(f"stopped by SIGTERM after step {step} (no checkpoints in this run: it starts again)")
    if ckpt.latest_step() != step:
        ckpt.save(step, state, meta)
    saved = ckpt.directory / str(step)
    raise Preempted(f"stopped by SIGTERM after step {step}; saved {saved}; the same command resumes from it", saved)
