"""Save/load a params pytree of nested dicts as one .npz (keys joined with "/") plus the ModelConfig as JSON."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from jaxrag.models import ModelConfig


def _flatten(tree, prefix=""):
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _flatten(v, key + "/")
        else:
            yield key, np.asarray(v)


def save_model(out_dir: str, mcfg: ModelConfig, params) -> None:
    os.makedirs(out_dir, exist_ok=True)
    np.savez(os.path.join(out_dir, "params.npz"), **dict(_flatten(params)))
    with open(os.path.join(out_dir, "model_config.json"), "w") as f:
        json.dump(dataclasses.asdict(mcfg), f, indent=1)


def load_model(out_dir: str) -> tuple[ModelConfig, dict]:
    cfg_path, params_path = os.path.join(out_dir, "model_config.json"), os.path.join(out_dir, "params.npz")
    for p in (cfg_path, params_path):
        if not os.path.exists(p):
            raise FileNotFoundError(f"{p}: no saved model here (run the training stage first)")
    d = json.load(open(cfg_path))
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    params: dict = {}
    with np.load(params_path) as z:
        for key in z.files:
            node = params
            *path, leaf = key.split("/")
            for p in path:
                node = node.setdefault(p, {})
            node[leaf] = z[key]
    return ModelConfig(**d), params
