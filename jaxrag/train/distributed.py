"""Multi-host start-up: call jax.distributed.initialize exactly when the launch asks for it.

- Explicit (local launcher, tests): JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID.
- Cluster auto-detection (TPU VM slice, SLURM): JAXRAG_DISTRIBUTED=auto -> jax.distributed.initialize().
- Otherwise: single process, nothing to do.
"""

from __future__ import annotations

import functools
import os
import pickle

import jax
import numpy as np
from jax._src import distributed as jax_distributed  # the client orbax's multihost barriers use
from jax.experimental import multihost_utils

_done = False


def maybe_initialize() -> bool:
    global _done
    if _done:
        return True

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


# ------------------------------------------------------------------------------ who writes, who waits, who holds what
def process_index() -> int:
    return jax.process_index()


def process_count() -> int:
    return jax.process_count()


def is_lead() -> bool:
    """Process 0: the one process that writes a run's shared files (metrics, episodes, tables, models, DONE)."""
    return process_index() == 0


def barrier(name: str) -> None:
    """Every process waits here until all have arrived (no-op on one process): after process 0 writes a file the
    others will read, and before anyone reads it. `name` must be the same string on every process."""
    if process_count() > 1:
        multihost_utils.sync_global_devices(name)


def to_host(tree):
    """A pytree of (possibly sharded, multi-process) jax arrays -> numpy on this process. An array that spans other
    processes' devices is gathered (process_allgather: a collective, so every process must call this together);
    process-local arrays are simply copied."""
    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(jax.device_get(x))

    return jax.tree.map(one, tree)


def to_local(tree):
    """A pytree of global (multi-process) arrays -> the same values on this process's first device (gathered:
    collective). Process-local code (each process's own sampler) needs arrays it holds whole; on one process the
    arrays are returned as they are."""
    if process_count() == 1:
        return tree
    dev = jax.local_devices()[0]
    return jax.tree.map(lambda a: jax.device_put(a, dev), to_host(tree))


def share(items: list, index: int | None = None, count: int | None = None) -> list:
    """This process's contiguous share of `items` (the first len % count processes get one more): process order
    = item order, so gathering the shares in process order restores the list."""
    index = process_index() if index is None else index
    count = process_count() if count is None else count
    n, extra = divmod(len(items), count)
    start = index * n + min(index, extra)
    return list(items[start:start + n + (index < extra)])


def allgather_objects(obj) -> list:
    """Every process's picklable `obj`, in process order, on every process (collective; [obj] on one process)."""
    if process_count() == 1:
        return [obj]
    blob = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([blob.size], np.int64))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:blob.size] = blob
    blobs = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    return [pickle.loads(blobs[i, :int(s)].tobytes()) for i, s in enumerate(sizes)]


def gather_shares(items: list) -> list:
    """The inverse of `share`: every process's list, concatenated in process order, on every process."""
    return [x for part in allgather_objects(list(items)) for x in part]


# ------------------------------------------------------------------------------ work that process 0 does alone
WAIT_FOR_LEAD_S = 7 * 24 * 3600  # how long the others wait for process 0's host-side work: no bound in practice


def wait_all(name: str, timeout_s: float = WAIT_FOR_LEAD_S) -> None:
    """A barrier through jax.distributed's coordination service, not a device collective: for the others to wait
    while process 0 works alone (sampling, judging) for as long as it takes, which a collective's own timeout (XLA's
    CPU collectives) would not allow. `name` must be the same string on every process and used once per run."""
    if process_count() > 1:
        jax_distributed.global_state.client.wait_at_barrier(name, timeout_in_ms=int(timeout_s * 1000))


def lead_only(stage):
    """A stage `fn(config, workdir, name)` whose work is host-side (sampling with a process-local policy, judging,
    tables, plots; no collective inside) run by process 0 alone: its files are written once and its results equal a
    one-process run's at any temperature (the same seeds, one sampling stream). The others wait until it is done;
    a stage that fails on process 0 ends the job there (the launchers end the waiting processes)."""

    @functools.wraps(stage)
    def run(config, workdir, name):
        if is_lead():
            stage(config, workdir, name)
        wait_all(f"lead_only:{workdir}:{name}")

    return run


def from_lead(compute, name: str):
    """`compute()` run on process 0 alone, its (picklable) result returned on every process: the host-side part of
    a stage whose later part runs on every process (e.g. sampling trajectories, then training on them)."""
    result = compute() if is_lead() else None
    wait_all(f"from_lead:{name}")
    return allgather_objects(result)[0]
