"""One process-wide count of JAX's compilation work (a jax.monitoring listener, registered once): what `jaxrag.main`
reports per stage and what a benchmark's timed run must show none of."""
from __future__ import annotations

import jax.monitoring

_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
           "/jax/core/compile/backend_compile_duration")
_totals = {"compiles": 0, "seconds": 0.0, "listening": False}


def _on_duration(event: str, secs: float, **_) -> None:
    if event in _EVENTS:
        _totals["seconds"] += secs
        _totals["compiles"] += event == _EVENTS[-1]


def compilation() -> tuple[int, float]:
    """(XLA backend compilations, seconds of tracing + lowering + compiling) in this process since the first call;
    two readings around a piece of work give its share."""
    if not _totals["listening"]:
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _totals["listening"] = True
    return _totals["compiles"], _totals["seconds"]
