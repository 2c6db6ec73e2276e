"""BERT-family text encoder in JAX (BERT, RoBERTa, XLM-RoBERTa checkpoints: MiniLM, BGE, E5, ...).

Loads a local Hugging Face dir (config.json + *.safetensors). Pure functions: `forward` gives hidden states,
`embed` pools (CLS or mean over the mask) and L2-normalizes. Tokenization and batching live on the host
(jaxrag/retrieval/dense.py).

Params (plain dict; layer weights stacked over a leading L axis, run with lax.scan):
  {"tok_embed": [V,D], "pos_embed": [P,D], "type_embed": [T,D], "embed_norm": {"scale": [D], "bias": [D]},
   "layers": {"wq","wk","wv": [L,D,H,Dh], "bq","bk","bv": [L,H,Dh], "wo": [L,H,Dh,D], "bo": [L,D],
              "attn_norm": {"scale","bias": [L,D]}, "w_in": [L,D,F], "b_in": [L,F], "w_out": [L,F,D],
              "b_out": [L,D], "mlp_norm": {"scale","bias": [L,D]}}}
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file

_ROBERTA_TYPES = ("roberta", "xlm-roberta", "camembert")
_ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    model_type: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    max_positions: int
    type_vocab_size: int
    ln_eps: float
    activation: str
    pad_id: int
    pooling: str = "mean"  # "mean" | "cls"
    normalize: bool = True

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def max_len(self) -> int:
        """Longest token sequence the position table allows (RoBERTa reserves pad_id + 1 slots)."""
        return self.max_positions - (self.pad_id + 1 if self.model_type in _ROBERTA_TYPES else 0)

    @classmethod
    def from_hf(cls, hf: dict, pooling: str = "mean", normalize: bool = True) -> "EncoderConfig":
        try:
            model_type = hf.get("model_type", "bert")
            act = hf.get("hidden_act", "gelu")
            if act not in _ACTIVATIONS:
                raise ValueError(f"unsupported hidden_act {act!r}")
            if hf.get("position_embedding_type", "absolute") != "absolute":
                raise ValueError(f"unsupported position_embedding_type {hf['position_embedding_type']!r}")
            if pooling not in ("mean", "cls"):
                raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
            return cls(
                model_type=model_type,
                vocab_size=hf["vocab_size"],
                d_model=hf["hidden_size"],
                n_layers=hf["num_hidden_layers"],
                n_heads=hf["num_attention_heads"],
                d_ff=hf["intermediate_size"],
                max_positions=hf["max_position_embeddings"],
                type_vocab_size=hf.get("type_vocab_size", 2),
                ln_eps=hf.get("layer_norm_eps", 1e-12),
                activation=act,
                pad_id=hf.get("pad_token_id", 0) or 0,
                pooling=pooling,
                normalize=normalize,
            )
        except KeyError as e:
            raise ValueError(f"config.json lacks key {e.args[0]!r}") from None


# ---------------------------------------------------------------- loading


def _strip_prefix(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    for prefix in ("bert.", "roberta.", "model.", "encoder.model."):
        if any(k.startswith(prefix + "embeddings.") for k in tensors):
            return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    return tensors


def params_from_hf(cfg: EncoderConfig, tensors: dict[str, np.ndarray], where: str = "checkpoint") -> dict:
    """HF BertModel/RobertaModel tensor names -> stacked params; a missing tensor raises naming it."""
    t = _strip_prefix(tensors)

    def get(name: str) -> np.ndarray:
        if name not in t:
            raise KeyError(f"{where}: missing tensor {name!r}")
        return np.asarray(t[name], np.float32)

    D, H, Dh = cfg.d_model, cfg.n_heads, cfg.head_dim

    def layer(i: int) -> dict:
        p = f"encoder.layer.{i}."
        proj = lambda n: get(p + f"attention.self.{n}.weight").T.reshape(D, H, Dh)  # HF Linear is [out, in]
        bias = lambda n: get(p + f"attention.self.{n}.bias").reshape(H, Dh)
        return {
            "wq": proj("query"),
            "wk": proj("key"),
            "wv": proj("value"),
            "bq": bias("query"),
            "bk": bias("key"),
            "bv": bias("value"),
            "wo": get(p + "attention.output.dense.weight").T.reshape(H, Dh, D),
            "bo": get(p + "attention.output.dense.bias"),
            "attn_norm": {
                "scale": get(p + "attention.output.LayerNorm.weight"),
                "bias": get(p + "attention.output.LayerNorm.bias"),
            },
            "w_in": get(p + "intermediate.dense.weight").T,
            "b_in": get(p + "intermediate.dense.bias"),
            "w_out": get(p + "output.dense.weight").T,
            "b_out": get(p + "output.dense.bias"),
            "mlp_norm": {"scale": get(p + "output.LayerNorm.weight"), "bias": get(p + "output.LayerNorm.bias")},
        }

    layers = [layer(i) for i in range(cfg.n_layers)]
    type_embed = (
        get("embeddings.token_type_embeddings.weight") if cfg.type_vocab_size > 0 else np.zeros((1, D), np.float32)
    )
    return jax.tree.map(
        jnp.asarray,
        {
            "tok_embed": get("embeddings.word_embeddings.weight"),
            "pos_embed": get("embeddings.position_embeddings.weight"),
            "type_embed": type_embed,
            "embed_norm": {"scale": get("embeddings.LayerNorm.weight"), "bias": get("embeddings.LayerNorm.bias")},
            "layers": jax.tree.map(lambda *xs: np.stack(xs), *layers),
        },
    )


def detect_pooling(path: Path) -> str:
    """sentence-transformers' 1_Pooling/config.json when present; else CLS for BGE, mean otherwise."""
    pool_cfg = path / "1_Pooling" / "config.json"
    if pool_cfg.is_file():
        d = json.loads(pool_cfg.read_text())
        if d.get("pooling_mode_cls_token"):
            return "cls"
        if d.get("pooling_mode_mean_tokens"):
            return "mean"
    return "cls" if "bge" in path.name.lower() else "mean"


def load_encoder(path: str | Path, pooling: str | None = None, normalize: bool = True) -> tuple[EncoderConfig, dict]:
    """Local HF dir -> (cfg, params). Errors name the file or tensor."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"encoder config not found: {cfg_file}")
    try:
        hf = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_file}: malformed JSON ({e.msg}, line {e.lineno})") from None
    try:
        cfg = EncoderConfig.from_hf(hf, pooling or detect_pooling(path), normalize)
    except ValueError as e:
        raise ValueError(f"{cfg_file}: {e}") from None
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path}")
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return cfg, params_from_hf(cfg, tensors, where=str(path))


# ---------------------------------------------------------------- forward


def _layer_norm(x, p, eps):
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def forward(
    cfg: EncoderConfig, params: dict, tokens: jax.Array, mask: jax.Array, types: jax.Array | None = None
) -> jax.Array:
    """tokens[B,T] int, mask[B,T] (1 = real token), types[B,T] token type ids (BERT's segment ids: 1 for the second
    text of a pair; None = all 0) -> hidden[B,T,D] float32."""
    mask = mask.astype(jnp.int32)
    if cfg.model_type in _ROBERTA_TYPES:
        positions = jnp.cumsum(mask, axis=1) * mask + cfg.pad_id
    else:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    type_embed = params["type_embed"][0] if types is None else params["type_embed"][types]
    x = params["tok_embed"][tokens] + params["pos_embed"][positions] + type_embed
    x = _layer_norm(x, params["embed_norm"], cfg.ln_eps)
    bias = jnp.where(mask[:, None, None, :] > 0, 0.0, jnp.finfo(jnp.float32).min)  # [B,1,1,T]
    act = _ACTIVATIONS[cfg.activation]
    scale = 1.0 / np.sqrt(cfg.head_dim)

    def block(x, p):
        q = jnp.einsum("btd,dhk->bthk", x, p["wq"]) + p["bq"]
        k = jnp.einsum("btd,dhk->bthk", x, p["wk"]) + p["bk"]
        v = jnp.einsum("btd,dhk->bthk", x, p["wv"]) + p["bv"]
        att = jax.nn.softmax(jnp.einsum("bqhk,bshk->bhqs", q, k) * scale + bias, axis=-1)
        o = jnp.einsum("bhqs,bshk->bqhk", att, v)
        x = _layer_norm(x + jnp.einsum("bqhk,hkd->bqd", o, p["wo"]) + p["bo"], p["attn_norm"], cfg.ln_eps)
        h = act(x @ p["w_in"] + p["b_in"]) @ p["w_out"] + p["b_out"]
        return _layer_norm(x + h, p["mlp_norm"], cfg.ln_eps), None

    x, _ = jax.lax.scan(block, x, params["layers"])
    return x


def pool(cfg: EncoderConfig, hidden: jax.Array, mask: jax.Array) -> jax.Array:
    """hidden[B,T,D], mask[B,T] -> [B,D] (CLS or masked mean), L2-normalized when cfg.normalize."""
    if cfg.pooling == "cls":
        out = hidden[:, 0]
    else:
        m = mask.astype(hidden.dtype)[..., None]
        out = (hidden * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)
    if cfg.normalize:
        out = out / jnp.maximum(jnp.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
    return out


def embed(
    cfg: EncoderConfig, params: dict, tokens: jax.Array, mask: jax.Array, types: jax.Array | None = None
) -> jax.Array:
    """tokens[B,T], mask[B,T], types[B,T] | None -> embeddings[B,D]."""
    return pool(cfg, forward(cfg, params, tokens, mask, types), mask)
