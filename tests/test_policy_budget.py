"""JaxPolicy's prompt budget: it supplies the budget (prompt_fits) and, for what is still over it, drops the
middle token ids (never the question at the start, never the generation prompt at the end), warned once."""
import logging

import pytest

from fakes import ByteTokenizer
from jaxrag.models.config import ModelConfig
from jaxrag.sampling import JaxPolicy


def policy(max_seq_len=128, max_prompt_tokens=None):
    cfg = ModelConfig(vocab_size=259, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64,
                      max_seq_len=max_seq_len, bos_id=1, eos_ids=(2,), pad_id=0)
    return JaxPolicy(cfg, None, ByteTokenizer(), max_prompt_tokens=max_prompt_tokens)   # encoding needs no params


def test_budget_counts_bos_and_takes_the_tighter_limit():
    pol = policy(max_seq_len=128)
    assert pol.prompt_budget(28) == 100 and policy(128, 90).prompt_budget(28) == 90
    assert pol.prompt_fits("x" * 99, 28) and not pol.prompt_fits("x" * 100, 28)    # + the BOS
    with pytest.raises(ValueError, match="max_new_tokens=128 >= the model's max_seq_len=128"):
        pol.prompt_budget(128)


def test_over_budget_keeps_the_question_and_the_end(caplog):
    pol = policy(max_seq_len=128)
    prompt = "question: who won?\n" + "doc: filler text\n" * 20 + "[assistant] "
    with caplog.at_level(logging.WARNING, logger="jaxrag.sampling.policy"):
        ids = pol.encode_prompt(prompt, 28)
        pol.encode_prompt(prompt + " ", 28)
    assert len(ids) == 100 and ids[0] == 1 and ids.count(1) == 1
    text = ByteTokenizer().decode(ids)
    assert text.startswith("question: who won?\n") and text.endswith("[assistant] ")
    assert pol.prompts_cut == 2 and len(caplog.records) == 1
    assert pol.encode_prompt("short", 28) == [1] + [b + 3 for b in b"short"]


def test_fits_then_generate_encodes_once():
    pol = policy()
    calls = []
    encode = pol.tokenizer.encode
    pol.tokenizer.encode = lambda text, add_bos=False: calls.append(text) or encode(text, add_bos)
    assert pol.prompt_fits("hello", 28)
    assert pol.encode_prompt("hello", 28) == [1] + [b + 3 for b in b"hello"]
    assert calls == ["hello"]
