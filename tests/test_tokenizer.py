"""Tokenizer wrapper over sentencepiece and local transformers tokenizers; JaxPolicy end to end."""

import jax
import pytest

from jaxrag.models import ModelConfig, init_params
from jaxrag.policy import JaxPolicy
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
