"""Functional Llama/Qwen2 model: config, params, forward pass, KV cache, critic head, Hugging Face I/O."""

from jaxrag.models.config import ConfigError, ModelConfig
from jaxrag.models.hf import CheckpointError, load_hf, save_hf
from jaxrag.models.transformer import (
    attention_mask,
    critic_init,
    critic_scores,
    decode_step,
    forward,
    forward_cached,
    forward_hidden,
    init_cache,
    init_params,
    logits_from_hidden,
    param_logical_axes,
    param_shapes,
    prefill,
    unstack_layers,
)

__all__ = [
    "CheckpointError",
    "ConfigError",
    "ModelConfig",
    "attention_mask",
    "critic_init",
    "critic_scores",
    "decode_step",
    "forward",
    "forward_cached",
    "forward_hidden",
    "init_cache",
    "init_params",
    "load_hf",
    "logits_from_hidden",
    "param_logical_axes",
    "param_shapes",
    "prefill",
    "save_hf",
    "unstack_layers",
]
