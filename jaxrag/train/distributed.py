"""Multi-host start-up: call jax.distributed.initialize exactly when the launch asks for it.

- Explicit (local launcher, tests): JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID.
- Cluster auto-detection (TPU VM slice, SLURM): JAXRAG_DISTRIBUTED=auto -> jax.distributed.initialize().
- Otherwise: single process, nothing to do.
"""

from __future__ import annotations

import os

_done = False


def maybe_initialize() -> bool:
    global _done
    if _done:
        return True
    import jax

    addr = os.environ.get("JAX_COORDINATOR_ADDRESS")
    if addr:
        n, pid = os.environ.get("JAX_NUM_PROCESSES"), os.environ.get("JAX_PROCESS_ID")
        if n is None or pid is None:
            raise RuntimeError("JAX_COORDINATOR_ADDRESS is set: JAX_NUM_PROCESSES and JAX_PROCESS_ID must be set too")
        local = os.environ.get("JAX_LOCAL_DEVICE_IDS")
        jax.distributed.initialize(addr, int(n), int(pid),
                                   local_device_ids=[int(x) for x in local.split(",")] if local else None)
    elif os.environ.get("JAXRAG_DISTRIBUTED") == "auto":
        jax.distributed.initialize()
    else:
        return False
    _done = True
    return True
