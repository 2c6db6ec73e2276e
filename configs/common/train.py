"""Shared config pieces for training stages (import from a config file: `from configs.common import train`)."""

import ml_collections

from jaxrag.train.config import default_train_config


def tiny_model() -> ml_collections.ConfigDict:
    """ModelConfig fields of a tiny random Llama (tests, examples, CPU benchmarks)."""
    return ml_collections.ConfigDict({
        "model_type": "llama", "vocab_size": 128, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
        "head_dim": 16, "d_ff": 128, "max_seq_len": 256,
    })


def train_stage(fn: str, data: str, init: str = "random", **train_overrides) -> ml_collections.ConfigDict:
    """A stage section: fn, data (JSONL under the workdir), init, tokenizer, train (locked trainer config),
    train_layout ("auto" | "rows" | "tree": DPO and critic pairs, and with "tree" GRPO groups, as a prefix tree;
    jaxrag.train.prefix_tree)."""
    t = default_train_config()
    for k, v in train_overrides.items():
        t[k] = v
    return ml_collections.ConfigDict({"fn": fn, "data": data, "init": init, "tokenizer": "", "train": t,
                                      "train_layout": "auto"})


def toy_data(n: int = 64, vocab_size: int = 128, max_len: int = 8, group_size: int = 4) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({"fn": "jaxrag.pipelines.train:toy_data_stage", "seed": 0, "n": n,
                                      "vocab_size": vocab_size, "max_len": max_len, "group_size": group_size})
