"""Local Hugging Face checkpoints (LlamaForCausalLM, Qwen2ForCausalLM) <-> (ModelConfig, params).

Strict by design: every tensor in the checkpoint must map onto a parameter and every parameter must be found
with the right shape, or the load fails with the tensor's name. Single-file and sharded safetensors (with
model.safetensors.index.json) both load. No PyTorch: safetensors' numpy reader.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from jaxrag.models.config import ModelConfig
from jaxrag.models.transformer import Params, param_shapes


class CheckpointError(ValueError):
    """A checkpoint directory that does not match its config or jaxrag's model."""


# HF tensor name (within a layer) -> (our name, how to turn the HF array into ours: 'W' = [out,in] -> in,out).
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_LAYER_MAP = {
    "input_layernorm.weight": "attn_norm",
    "post_attention_layernorm.weight": "mlp_norm",
    "self_attn.q_proj.weight": "wq",
    "self_attn.k_proj.weight": "wk",
    "self_attn.v_proj.weight": "wv",
    "self_attn.o_proj.weight": "wo",
    "self_attn.q_proj.bias": "bq",
    "self_attn.k_proj.bias": "bk",
    "self_attn.v_proj.bias": "bv",
    "self_attn.o_proj.bias": "bo",
    "mlp.gate_proj.weight": "w_gate",
    "mlp.up_proj.weight": "w_up",
    "mlp.down_proj.weight": "w_down",
}
_TOP_MAP = {"model.embed_tokens.weight": "embed", "model.norm.weight": "final_norm", "lm_head.weight": "lm_head"}
_IGNORED = re.compile(r"rotary_emb\.inv_freq$")


def _hf_to_ours(name: str, a: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """One layer's HF array -> our layout (without the layer axis)."""
    H, K, Dh, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
    if name == "wq":
        return a.reshape(H, Dh, D).transpose(2, 0, 1)
    if name in ("wk", "wv"):
        return a.reshape(K, Dh, D).transpose(2, 0, 1)
    if name == "wo":
        return a.T.reshape(H, Dh, D)
    if name == "bq":
        return a.reshape(H, Dh)
    if name in ("bk", "bv"):
        return a.reshape(K, Dh)
    if name in ("w_gate", "w_up", "w_down", "lm_head"):
        return a.T
    return a


def _ours_to_hf(name: str, a: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    H, K, Dh, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
    if name == "wq":
        return a.transpose(1, 2, 0).reshape(H * Dh, D)
    if name in ("wk", "wv"):
        return a.transpose(1, 2, 0).reshape(K * Dh, D)
    if name == "wo":
        return a.reshape(H * Dh, D).T
    if name in ("bq", "bk", "bv"):
        return a.reshape(-1)
    if name in ("w_gate", "w_up", "w_down", "lm_head"):
        return a.T
    return a


def _hf_shape(name: str, ours: tuple, cfg: ModelConfig) -> tuple:
    return _ours_to_hf(name, np.empty(ours, np.int8), cfg).shape


def _checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index}: not a safetensors index ({e})") from None
        files = sorted({path / f for f in weight_map.values()})
        for f in files:
            if not f.exists():
                raise CheckpointError(f"{index}: names shard {f.name}, which is missing")
        return files
    single = path / "model.safetensors"
    if single.exists():
        return [single]
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json")


def _read_tensors(path: Path) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for f in _checkpoint_files(path):
        try:
            tensors.update(load_file(str(f)))
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{f}: cannot read safetensors ({e})") from None
        except Exception as e:  # bf16 tensors need ml_dtypes; anything else is a corrupt file
            raise CheckpointError(f"{f}: cannot read safetensors ({type(e).__name__}: {e})") from None
    return tensors


def load_hf(path: str | Path, dtype: str | None = None) -> tuple[ModelConfig, Params]:
    """A local Llama/Qwen2 Hugging Face checkpoint dir -> (ModelConfig, params). dtype: param dtype (default fp32)."""
    path = Path(path)
    cfg = ModelConfig.from_json(path / "config.json")
    cfg = cfg.replace(param_dtype=dtype or "float32")
    shapes = param_shapes(cfg)
    tensors = _read_tensors(path)
    layers: dict[str, list] = {n: [None] * cfg.n_layers for n in shapes["layers"]}
    params: Params = {}
    unexpected = []
    for hf_name, a in tensors.items():
        if _IGNORED.search(hf_name):
            continue
        m = _LAYER_RE.match(hf_name)
        if m:
            i, rest = int(m.group(1)), m.group(2)
            name = _LAYER_MAP.get(rest)
            if name is None or name not in layers or i >= cfg.n_layers:
                unexpected.append(hf_name)
                continue
            want = _hf_shape(name, shapes["layers"][name][1:], cfg)
            if a.shape != want:
                raise CheckpointError(f"{path}: tensor {hf_name} has shape {a.shape}, expected {want}")
            layers[name][i] = _hf_to_ours(name, a, cfg)
            continue
        name = _TOP_MAP.get(hf_name)
        if name == "lm_head" and cfg.tie_embeddings:
            continue  # some tied checkpoints store the (identical) head as well
        if name is None or name not in shapes:
            unexpected.append(hf_name)
            continue
        want = _hf_shape(name, shapes[name], cfg)
        if a.shape != want:
            raise CheckpointError(f"{path}: tensor {hf_name} has shape {a.shape}, expected {want}")
        params[name] = _hf_to_ours(name, a, cfg)
    if unexpected:
        raise CheckpointError(f"{path}: unexpected tensors not in a {cfg.model_type} model: {sorted(unexpected)[:8]}")
    missing = [n for n in shapes if n != "layers" and n not in params]
    missing += [f"model.layers.{i}.{hf}" for hf, n in _LAYER_MAP.items() if n in layers for i, a in enumerate(layers[n]) if a is None]
    if missing:
        raise CheckpointError(f"{path}: missing tensors: {missing[:8]}")
    pdt = jnp.dtype(cfg.param_dtype)
    params = {n: jnp.asarray(a, pdt) for n, a in params.items()}
    params["layers"] = {n: jnp.asarray(np.stack(v), pdt) for n, v in layers.items()}
    return cfg, params


def stored_dtype(path: str | Path) -> str | None:
    """The dtype a Hugging Face checkpoint's weights are stored in, from its config.json ("torch_dtype", or 5.x's
    "dtype"); None when it names none."""
    try:
        d = json.loads((Path(path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    dt = d.get("torch_dtype") or d.get("dtype")
    return str(dt) if dt in SAVE_DTYPES else None


SAVE_DTYPES = ("float32", "bfloat16", "float16")


def params_dtype(params: Params) -> str:
    """The dtype the weights are held in: the widest floating dtype among the arrays (float32 if any is)."""
    kinds = {str(np.dtype(getattr(a, "dtype", np.float32))) for a in jax.tree.leaves(params)}
    for dt in SAVE_DTYPES:
        if dt in kinds:
            return dt
    return "float32"


def generation_config(cfg: ModelConfig) -> dict:
    """A minimal generation_config.json (the special ids transformers' generate stops and pads with)."""
    eos = list(cfg.eos_ids)
    return {"bos_token_id": cfg.bos_id, "eos_token_id": (eos if len(eos) != 1 else eos[0]) or None,
            "pad_token_id": cfg.pad_id}


def save_hf(cfg: ModelConfig, params: Params, path: str | Path, max_shard_bytes: int = 4 << 30,
            dtype: str | None = None) -> Path:
    """Write config.json + safetensors (sharded with an index when over max_shard_bytes) + generation_config.json
    that transformers loads. dtype: the stored dtype ("float32" | "bfloat16" | "float16"); None = the dtype the
    weights are held in (`params_dtype`: weights loaded as bf16 are written as bf16, fp32 ones as fp32).
    `params` must be addressable here (pipelines.common.save_checkpoint gathers sharded ones first)."""
    dtype = dtype or params_dtype(params)
    if dtype not in SAVE_DTYPES:
        raise ValueError(f"save_hf: dtype {dtype!r}: one of {SAVE_DTYPES}")
    np_dtype = jnp.dtype(dtype)  # bfloat16 via ml_dtypes, which safetensors' numpy writer stores as BF16
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    inv_top = {v: k for k, v in _TOP_MAP.items()}
    inv_layer = {v: k for k, v in _LAYER_MAP.items()}
    tensors: dict[str, np.ndarray] = {}
    for name, a in params.items():
        if name == "layers":
            continue
        tensors[inv_top[name]] = np.ascontiguousarray(_ours_to_hf(name, np.asarray(a).astype(np_dtype), cfg))
    for name, stacked in params["layers"].items():
        stacked = np.asarray(stacked).astype(np_dtype)
        for i in range(cfg.n_layers):
            tensors[f"model.layers.{i}.{inv_layer[name]}"] = np.ascontiguousarray(_ours_to_hf(name, stacked[i], cfg))
    hf_cfg = cfg.to_hf_dict()
    hf_cfg["torch_dtype"] = dtype
    (path / "config.json").write_text(json.dumps(hf_cfg, indent=2))
    (path / "generation_config.json").write_text(json.dumps(generation_config(cfg), indent=2))
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name in sorted(tensors):
        nbytes = tensors[name].nbytes
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(path / "model.safetensors"), metadata={"format": "pt"})
        return path
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in shard})
    total = sum(a.nbytes for a in tensors.values())
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return path
