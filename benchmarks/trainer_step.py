"""The trainer's own jitted step on a one-device mesh, as the benches time it (benchmarks.train, benchmarks.model)."""

from __future__ import annotations

from typing import Callable

import jax

from jaxrag import sharding as shd
from jaxrag.models import ModelConfig
from jaxrag.train import config as tconfig
from jaxrag.train.learner import build
from jaxrag.train.state import init_state, put


def trainer_step(cfg: ModelConfig, params, train: dict, batch: dict) -> Callable[[], None]:
    """A blocking step() of `jaxrag.train.learner.build`'s step_fn for the trainer config `train` (overrides of the
    defaults; mesh (1, 1, 1)) on the host batch `batch`. The step donates its state: step() keeps the newest one."""
    tc = tconfig.resolve({"mesh": (1, 1, 1), **train})
    tr = build(cfg, params, tc, mesh=shd.make_mesh((1, 1, 1), jax.devices()[:1]))
    frozen = put(tr.frozen, tr.frozen_sh)
    dev_batch = shd.shard_batch(tr.mesh, batch)
    carry = {"state": init_state(put(tr.trainable, tr.state_sh["trainable"]), tr.tx, 0, tr.state_sh)}

    def step() -> None:
        carry["state"], m = tr.step_fn(carry["state"], frozen, dev_batch)
        jax.block_until_ready(m)

    return step
