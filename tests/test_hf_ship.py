"""Checkpoints that ship: a bf16 model with a chat template saved by jaxrag comes back as it went in, and
transformers reads it in bf16 with the same template, special tokens and generation config."""

import json

import jax
import numpy as np
import pytest

TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}" \
           "{% if add_generation_prompt %}<|assistant|>{% endif %}"


@pytest.fixture(scope="module")
def bf16_chat_checkpoint(tmp_path_factory):
    """A tiny Llama saved by transformers in bfloat16 beside a byte-level BPE with a chat template and a
    generation config of its own (temperature 0.6, as chat models ship)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("bf16_chat")
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, do_sample=True, temperature=0.6).save_pretrained(path)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["the user asks and the assistant answers"] * 4, trainers.BpeTrainer(
        vocab_size=128, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(str(path))
    return path


def test_bf16_chat_checkpoint_round_trips(bf16_chat_checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from jaxrag.models import load_hf, save_hf
    from jaxrag.models.hf import stored_dtype
    from jaxrag.pipelines.common import load_checkpoint, save_checkpoint

    src = bf16_chat_checkpoint
    assert stored_dtype(src) == "bfloat16"
    cfg, params = load_hf(src, dtype="bfloat16")
    out = save_checkpoint(tmp_path / "model", cfg, params, src)  # dtype: the weights' own (bf16)
    hf_cfg = json.loads((out / "config.json").read_text())
    assert hf_cfg["torch_dtype"] == "bfloat16"
    assert (out / "model.safetensors").stat().st_size < (src / "model.safetensors").stat().st_size * 1.1
    # the tokenizer, its chat template and the model's generation defaults travel with the model
    assert (out / "chat_template.jinja").read_text() == (src / "chat_template.jinja").read_text()
    gen = GenerationConfig.from_pretrained(out)
    assert gen.temperature == 0.6 and gen.eos_token_id == 2
    tok = AutoTokenizer.from_pretrained(out)
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == AutoTokenizer.from_pretrained(src).apply_chat_template(
        msgs, tokenize=False) == "<|user|>hi</s>"
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    # the weights: bit-equal to the source, both for jaxrag and for transformers (which keeps them in bf16)
    _, back = load_checkpoint(out)
    _, ref = load_hf(src)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(ref)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    import torch

    m_out = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    m_src = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
    assert m_out.dtype == torch.bfloat16
    for (n, a), (_, b) in zip(m_out.state_dict().items(), m_src.state_dict().items()):
        assert torch.equal(a, b), n
    # float32 on request (and the default for fp32 weights): the same values, widened
    f32 = save_hf(cfg, jax.tree.map(lambda a: a.astype("float32"), params), tmp_path / "f32")
    assert json.loads((f32 / "config.json").read_text())["torch_dtype"] == "float32"
    assert json.loads((save_hf(cfg, params, tmp_path / "f32b", dtype="float32") / "config.json").read_text())[
        "torch_dtype"] == "float32"
    with pytest.raises(ValueError, match="dtype 'int8'"):
        save_hf(cfg, params, tmp_path / "bad", dtype="int8")


def test_generation_config_written_without_a_tokenizer_dir(tmp_path):
    from jaxrag.models import ModelConfig, init_params
    from jaxrag.pipelines.common import save_checkpoint

    cfg = ModelConfig(model_type="llama", vocab_size=64, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
                      head_dim=8, d_ff=32, bos_id=1, eos_ids=(2, 3), pad_id=0)
    out = save_checkpoint(tmp_path / "m", cfg, init_params(cfg, jax.random.PRNGKey(0)))
    assert json.loads((out / "generation_config.json").read_text()) == {"bos_token_id": 1, "eos_token_id": [2, 3],
                                                                        "pad_token_id": 0}
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float32"
