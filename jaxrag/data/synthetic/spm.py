"""Train a small sentencepiece model on the world's text (names split into reusable syllable pieces)."""

from __future__ import annotations

import io
import os

import sentencepiece as spm

# Tag strings the agents emit; kept whole so an action tag is one token.
DEFAULT_TAGS = (
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<result>",
    "</result>",
    "<answer>",
    "</answer>",
    "<query>",
    "</query>",
    "<evidence>",
    "</evidence>",
    "<relevance>",
    "</relevance>",
    "<analysis>",
    "</analysis>",
    "<information>",
    "</information>",
    "\\boxed{",
)


def train_sentencepiece(
    texts: list[str],
    model_path: str,
    vocab_size: int = 1024,
    user_defined_symbols=DEFAULT_TAGS,
    max_piece_length: int = 8,
    model_type: str = "bpe",
) -> str:
    """Train a model (BPE by default) on `texts`; writes `model_path` (must end in .model) and returns it.

    Short pieces (<= max_piece_length chars) keep names split into syllable-sized pieces, so an unseen name is
    built from pieces the model has seen; digits are split so years are compared digit by digit. "\n" is a symbol of its own and the text is not
    normalized, so decode(encode(text)) == text for the plain agents' line-based prompts.
    """
    if not model_path.endswith(".model"):
        raise ValueError(f"train_sentencepiece: model_path={model_path!r} must end in .model")
    if not texts:
        raise ValueError("train_sentencepiece: no texts to train on")
    os.makedirs(os.path.dirname(model_path) or ".", exist_ok=True)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=buf,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,
        user_defined_symbols=["\n", *user_defined_symbols],
        split_digits=True,
        max_sentencepiece_length=max_piece_length,
        byte_fallback=True,
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
        # keep text byte-exact: newlines separate the plain agents' lines, spaces are significant
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
    )
    with open(model_path, "wb") as f:
        f.write(buf.getvalue())
    return model_path
