"""Bad checkpoints and configs fail with a message naming the file, key or tensor; both config dialects load."""

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxrag.models import CheckpointError, ConfigError, ModelConfig, load_hf


@pytest.fixture()
def ckpt(llama3_checkpoint, tmp_path):
    _, path = llama3_checkpoint
    dst = tmp_path / "ckpt"
    shutil.copytree(path, dst)
    return dst


def _edit_tensors(path, fn):
    t = load_file(str(path / "model.safetensors"))
    fn(t)
    save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_unknown_model_type(ckpt):
    c = json.loads((ckpt / "config.json").read_text())
    c["model_type"] = "gpt_neox"
    (ckpt / "config.json").write_text(json.dumps(c))
    with pytest.raises(ConfigError, match="unknown model_type 'gpt_neox'"):
        load_hf(ckpt)


def test_missing_tensor_is_named(ckpt):
    _edit_tensors(ckpt, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensors: \['model.layers.1.mlp.up_proj.weight'\]"):
        load_hf(ckpt)


def test_unexpected_tensor_is_named(ckpt):
    _edit_tensors(ckpt, lambda t: t.__setitem__("model.layers.0.self_attn.extra.weight", np.zeros(3, np.float32)))
    with pytest.raises(CheckpointError, match="unexpected tensors.*model.layers.0.self_attn.extra.weight"):
        load_hf(ckpt)


def test_shape_mismatch_is_named(ckpt):
    _edit_tensors(ckpt, lambda t: t.__setitem__("model.norm.weight", np.ones(63, np.float32)))
    with pytest.raises(CheckpointError, match=r"model.norm.weight has shape \(63,\), expected \(64,\)"):
        load_hf(ckpt)


def test_corrupt_safetensors(ckpt):
    (ckpt / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(CheckpointError, match="model.safetensors: cannot read"):
        load_hf(ckpt)


def test_missing_weights_and_bad_json(ckpt):
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json: invalid JSON at line 1"):
        load_hf(ckpt)
    with pytest.raises(ConfigError, match="no such file"):
        load_hf(ckpt / "nowhere")


def test_missing_shard_named(ckpt):
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match="model-00001-of-00002.safetensors, which is missing"):
        load_hf(ckpt)


def _llama31_4x():
    """Llama-3.1-8B's config.json as published (transformers 4.x dialect)."""
    return {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 128000,
            "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
            "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False,
            "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
            "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"}, "rope_theta": 500000.0,
            "tie_word_embeddings": False, "vocab_size": 128256}


def test_both_config_dialects_give_the_same_config():
    old = _llama31_4x()
    new = dict(old)
    new["rope_parameters"] = dict(new.pop("rope_scaling"), rope_theta=new.pop("rope_theta"))
    a, b = ModelConfig.from_hf_dict(old), ModelConfig.from_hf_dict(new)
    assert a == b
    assert a.rope_scaling_dict["factor"] == 8.0 and a.rope_theta == 500000.0 and a.eos_ids == (128001, 128008, 128009)
    assert a.head_dim == 128 and a.n_kv_heads == 8
    # Qwen2.5-7B style: default rope, q/k/v bias implied by model_type
    q = ModelConfig.from_hf_dict({"model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584,
                                  "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
                                  "num_key_value_heads": 4, "rope_theta": 1000000.0, "use_sliding_window": False,
                                  "tie_word_embeddings": False})
    assert q.qkv_bias and q.rope_scaling is None and q.head_dim == 128
    assert abs(a.num_params() - 8.03e9) < 0.01e9


def test_unsupported_features_fail_loudly():
    with pytest.raises(ConfigError, match="missing key 'hidden_size'"):
        ModelConfig.from_hf_dict({"model_type": "llama", "vocab_size": 10})
    bad = _llama31_4x()
    bad["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    with pytest.raises(ConfigError, match="unsupported rope_type 'yarn'"):
        ModelConfig.from_hf_dict(bad)
