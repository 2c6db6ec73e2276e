"""Training: fixed-shape batching, loss step builders, the fit loop, orbax checkpoints, metrics logging.

    from jaxrag.train import fit, SFTExample, sft_batch, BatchStream
"""

from jaxrag.train.batching import (
    BatchStream,
    Group,
    PreferencePair,
    SFTExample,
    group_batch,
    pair_batch,
    sft_batch,
)
from jaxrag.train.checkpoint import CheckpointCorrupt
from jaxrag.train.config import default_train_config
from jaxrag.train.learner import NonFiniteLoss
from jaxrag.train.loop import FitResult, fit

__all__ = [
    "BatchStream", "CheckpointCorrupt", "FitResult", "Group", "NonFiniteLoss", "PreferencePair", "SFTExample",
    "default_train_config", "fit", "group_batch", "pair_batch", "sft_batch",
]
