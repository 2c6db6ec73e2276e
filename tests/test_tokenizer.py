"""Tokenizer wrapper over sentencepiece and local transformers tokenizers; JaxPolicy end to end."""

import jax
import pytest

from jaxrag.models import ModelConfig, init_params
from jaxrag.sampling import JaxPolicy
from jaxrag.tokenizer import HFTokenizer, SentencePieceTokenizer, load_tokenizer

TEXT = ["the film was directed by alora venn", "where was the director of the film born",
        "<search> who directed the film </search>", "the city of brandmoor is in the country of kelvar"] * 50


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
    import sentencepiece as spm

    d = tmp_path_factory.mktemp("spm")
    (d / "text.txt").write_text("\n".join(TEXT))
    spm.SentencePieceTrainer.train(input=str(d / "text.txt"), model_prefix=str(d / "tok"), vocab_size=36,
                                   user_defined_symbols=["<search>", "</search>"], pad_id=0, unk_id=3,
                                   bos_id=1, eos_id=2, minloglevel=2)
    return d / "tok.model"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for t in TEXT for w in t.split()})
    vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>", "<|im_end|>"] + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} <|im_end|> {% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
    d = tmp_path_factory.mktemp("hftok")
    fast.save_pretrained(d)
    return d


def test_sentencepiece_round_trip_and_specials(sp_model):
    tok = load_tokenizer(sp_model)
    assert isinstance(tok, SentencePieceTokenizer)
    ids = tok.encode(TEXT[2], add_bos=True)
    assert ids[0] == tok.bos_id == 1 and tok.eos_ids == (2,)
    assert tok.decode(ids) == TEXT[2]
    assert tok.encode("<search>")[-1] == tok.sp.piece_to_id("<search>")  # tag is one piece
    assert tok.chat([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a\n\nb"


def test_hf_tokenizer_chat_template_and_turn_end(hf_dir):
    tok = load_tokenizer(hf_dir)
    assert isinstance(tok, HFTokenizer)
    assert tok.decode(tok.encode("the film was directed")) == "the film was directed"
    assert tok.chat([{"role": "user", "content": "hi"}]) == "[user] hi <|im_end|> [assistant] "
    assert set(tok.eos_ids) == {2, 4}  # </s> and the Qwen-style turn end


def test_missing_tokenizer_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a sentencepiece"):
        load_tokenizer(tmp_path / "nothing")


def test_jax_policy_generates_text_with_stop_strings(sp_model):
    tok = load_tokenizer(sp_model)
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16,
                      d_ff=64, max_seq_len=96, eos_ids=tok.eos_ids)
    pol = JaxPolicy(cfg, init_params(cfg, jax.random.PRNGKey(0)), tok)
    out = pol.generate(["who directed the film", "where"], n=3, temperature=1.0, max_new_tokens=20, stop=["</search>"], seed=3)
    assert [len(r) for r in out] == [3, 3]
    for row in out:
        for c in row:
            assert c.finish_reason in ("eos", "stop", "length") and len(c.token_ids) == len(c.logprobs) <= 20
            assert c.text == tok.decode(c.token_ids)
            if c.finish_reason == "stop":
                assert c.text.rstrip().endswith("</search>")
    assert len({tuple(c.token_ids) for c in out[0]}) > 1  # n samples differ
    assert out[0][0].prompt_ids[0] == tok.bos_id


def _bos_tokenizer(d, template_emits_bos: bool):
    """A tiny Llama-3-like tokenizer built with the tokenizers library: BOS `<|begin_of_text|>`, turn end
    `<|eot_id|>`; its chat template starts with the BOS (as Llama-3's does) or not (as Qwen2's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for t in TEXT for w in t.split()} | {"[user]", "[assistant]", "[system]"})
    vocab = {w: i for i, w in enumerate(["<pad>", "<|begin_of_text|>", "<|end_of_text|>", "<unk>", "<|eot_id|>"] + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                                   pad_token="<pad>", unk_token="<unk>",
                                   additional_special_tokens=["<|eot_id|>"])
    fast.chat_template = (("{{ bos_token }}" if template_emits_bos else "") +
                          "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} <|eot_id|> {% endfor %}"
                          "{% if add_generation_prompt %}[assistant] {% endif %}")
    fast.save_pretrained(d)
    return load_tokenizer(d)


@pytest.mark.parametrize("template_emits_bos", [True, False])
def test_one_bos_whatever_the_chat_template(tmp_path, template_emits_bos):
    tok = _bos_tokenizer(tmp_path, template_emits_bos)
    prompt = tok.chat([{"role": "system", "content": "where"}, {"role": "user", "content": "who directed the film"}])
    assert prompt.startswith("<|begin_of_text|>") == template_emits_bos
    ids = tok.encode(prompt, add_bos=True)
    assert ids[0] == tok.bos_id == 1 and ids.count(tok.bos_id) == 1
    assert tok.encode(prompt, add_bos=False)[0] == (1 if template_emits_bos else tok.encode("[system]")[0])
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16,
                      d_ff=64, max_seq_len=64, bos_id=tok.bos_id, eos_ids=tok.eos_ids)
    pol = JaxPolicy(cfg, init_params(cfg, jax.random.PRNGKey(0)), tok)
    assert pol.encode_prompt(prompt, 8) == ids
    [[c]] = pol.generate([prompt], max_new_tokens=2)
    assert c.prompt_ids == ids and c.prompt_ids.count(tok.bos_id) == 1


def test_sentencepiece_bos_added_once(sp_model):
    tok = load_tokenizer(sp_model)
    ids = tok.encode(TEXT[0], add_bos=True)
    assert ids.count(tok.bos_id) == 1 and ids[0] == tok.bos_id and tok.encode(TEXT[0])[0] != tok.bos_id
