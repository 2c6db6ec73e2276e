"""ModelConfig: one frozen dataclass for Llama-3.x and Qwen2/2.5, and its Hugging Face config.json dialects.

transformers 4.x writes `rope_theta` and `rope_scaling` at the top level (how the published Llama-3.1 and
Qwen2.5 checkpoints are written); 5.x writes `rope_parameters` (with `rope_theta` inside). Both load.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear")
PRECISIONS = ("default", "high", "highest")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "dpa_xla", "splash")


class ConfigError(ValueError):
    """A Hugging Face config.json that jaxrag cannot represent faithfully."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    model_type: str = "llama"
    vocab_size: int = 32000
    d_model: int = 512
    n_layers: int = 8
    n_heads: int = 8
    n_kv_heads: int = 2
    head_dim: int = 64
    d_ff: int = 1536
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    # None, or a dict: {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    # "original_max_position_embeddings"} or {"rope_type": "linear", "factor"}. Stored as a sorted tuple of
    # items so the dataclass stays hashable (jit static argument).
    rope_scaling: tuple | None = None
    max_seq_len: int = 2048
    qkv_bias: bool = False  # Qwen2: bias on q/k/v projections
    o_bias: bool = False  # Llama with attention_bias=True: bias on o_proj too
    tie_embeddings: bool = False
    param_dtype: str = "float32"
    dtype: str = "float32"  # compute dtype for matmuls; norms, softmax, logits are float32
    # Matmul/einsum precision (jax.lax.Precision name). None = by compute dtype: "highest" for float32 (true fp32
    # products: XLA's default on GPU rounds fp32 inputs to TF32, ~3e-4 logit error), "default" for bf16/fp16.
    precision: str | None = None
    # Full-sequence attention (training, scoring, prefill): "xla" = jaxrag's own batched-GEMM attention (the CPU
    # path); "cudnn" = jax.nn.dot_product_attention(implementation="cudnn"), cuDNN flash attention (GPU, bf16/fp16
    # compute); "splash" = the Pallas splash-attention kernel (TPU; models/tpu_attention.py); "auto" = splash on
    # a TPU, cudnn where it applies, else xla; "dpa_xla" = the cudnn path's call and masks run by XLA
    # (any backend; checks the mask plumbing). Decode over the KV cache always uses the xla path.
    attention_impl: str = "auto"
    # Full-sequence passes over stacked layers: True = lax.scan (compile time flat in depth), False = an unrolled
    # loop over the layers' slices; None = unrolled on a GPU (XLA:GPU copies each layer's slice of the stacked
    # weights, gradients and residuals: a Llama-3.2-1B loss gradient took 332 ms scanned, 278 unrolled on an H100,
    # benchmarks.train_profile), scanned elsewhere. The same values either way.
    scan_layers: bool | None = None
    cache_dtype: str | None = None  # KV cache storage dtype (e.g. "bfloat16" to halve decode's cache reads); None = dtype
    # Attention over the KV cache (decode, continuing a cache): 0 = every slot in one pass; n > 0 = in a cache of
    # at least 8n slots, only the filled window (the first slot any row holds to the newest token), n slots at a
    # time with an online softmax, whenever its blocks cover at most half the cache: a step reads what the rows
    # hold, not the cache's size (a slot pool is sized for its longest request). None = 64 on CPU (a 1,024-slot
    # cache holding 192 tokens: 35.1 -> 24.3 ms a step, benchmarks.model), 256 on TPU (tpu_attention.DECODE_CACHE_BLOCK:
    # JAX's Pallas decode kernels need a paged cache; not yet timed on a TPU), 0 on GPU until measured there (a
    # loop of small blocks per layer, where a fused kernel is the answer). The same values up to float rounding.
    cache_block: int | None = None
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    pad_id: int | None = None

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(f"unknown model_type {self.model_type!r}; supported: {SUPPORTED_MODEL_TYPES}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", tuple(sorted(self.rope_scaling.items())))
        if isinstance(self.eos_ids, (list, int)):
            object.__setattr__(self, "eos_ids", tuple([self.eos_ids] if isinstance(self.eos_ids, int) else self.eos_ids))
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ConfigError(f"precision={self.precision!r}; supported: None (by dtype) or one of {PRECISIONS}")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ConfigError(f"attention_impl={self.attention_impl!r}; supported: {ATTENTION_IMPLS}")
        if self.cache_block is not None and self.cache_block < 0:
            raise ConfigError(f"cache_block={self.cache_block}; need None (by backend), 0 (one pass) or a block size > 0")
        scaling = self.rope_scaling_dict
        if scaling is not None and scaling.get("rope_type", "default") not in SUPPORTED_ROPE_TYPES:
            raise ConfigError(f"unsupported rope_type {scaling.get('rope_type')!r}; supported: {SUPPORTED_ROPE_TYPES}")

    @property
    def rope_scaling_dict(self) -> dict | None:
        return None if self.rope_scaling is None else dict(self.rope_scaling)

    @property
    def matmul_precision(self) -> str:
        """The precision every matmul/einsum of the model runs at: `precision`, or by the compute dtype."""
        if self.precision is not None:
            return self.precision
        return "highest" if self.dtype == "float32" else "default"

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    def num_params(self) -> int:
        attn = self.d_model * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)
        mlp = 3 * self.d_model * self.d_ff
        per_layer = attn + mlp + 2 * self.d_model
        head = 0 if self.tie_embeddings else self.vocab_size * self.d_model
        return self.vocab_size * self.d_model + self.n_layers * per_layer + self.d_model + head

    # ----------------------------------------------------------------- Hugging Face config.json <-> ModelConfig
    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config.json") -> "ModelConfig":
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(f"{source}: unknown model_type {model_type!r}; jaxrag loads {SUPPORTED_MODEL_TYPES}")
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if key not in d:
                raise ConfigError(f"{source}: missing key {key!r}")
        if d.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"{source}: hidden_act {d['hidden_act']!r} is not supported (only 'silu')")
        if d.get("mlp_bias", False):
            raise ConfigError(f"{source}: mlp_bias=True is not supported")
        if model_type == "qwen2" and d.get("use_sliding_window", False):
            raise ConfigError(f"{source}: use_sliding_window=True is not supported")
        rope = d.get("rope_parameters")  # transformers 5.x dialect
        if rope is not None:
            rope = dict(rope)
            theta = rope.pop("rope_theta", d.get("rope_theta", 10000.0))
        else:  # transformers 4.x dialect
            theta = d.get("rope_theta", 10000.0)
            rope = dict(d["rope_scaling"]) if d.get("rope_scaling") else None
        if rope is not None:
            rope_type = rope.pop("type", None) or rope.get("rope_type", "default")
            rope["rope_type"] = rope_type
            rope.pop("partial_rotary_factor", None)
            if rope_type == "default":
                rope = None
        n_heads = d["num_attention_heads"]
        eos = d.get("eos_token_id")
        attn_bias = bool(d.get("attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=d["vocab_size"],
            d_model=d["hidden_size"],
            n_layers=d["num_hidden_layers"],
            n_heads=n_heads,
            n_kv_heads=d.get("num_key_value_heads") or n_heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // n_heads,
            d_ff=d["intermediate_size"],
            rms_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=rope,
            max_seq_len=d.get("max_position_embeddings", 2048),
            qkv_bias=True if model_type == "qwen2" else attn_bias,
            o_bias=attn_bias if model_type == "llama" else False,
            tie_embeddings=bool(d.get("tie_word_embeddings", False)),
            bos_id=d.get("bos_token_id"),
            eos_ids=() if eos is None else eos,
            pad_id=d.get("pad_token_id"),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json in the transformers 4.x dialect (which 5.x also reads)."""
        arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[self.model_type]
        d = {
            "architectures": [arch],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.d_model,
            "intermediate_size": self.d_ff,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling_dict,
            "max_position_embeddings": self.max_seq_len,
            "tie_word_embeddings": self.tie_embeddings,
            "bos_token_id": self.bos_id,
            "eos_token_id": (list(self.eos_ids) if len(self.eos_ids) != 1 else self.eos_ids[0]) or None,
            "pad_token_id": self.pad_id,
            "torch_dtype": self.param_dtype,
        }
        if self.model_type == "llama":
            d["attention_bias"] = self.o_bias
            d["mlp_bias"] = False
            if self.qkv_bias != self.o_bias:
                raise ConfigError("a llama config has either biases on q/k/v/o (attention_bias) or none")
        else:
            d["use_sliding_window"] = False
        return d

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such file") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None
        return cls.from_hf_dict(d, source=str(path))
