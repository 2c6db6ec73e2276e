"""One tokenizer interface over Hugging Face tokenizers (local dirs) and sentencepiece models.

`chat(messages)` renders a conversation with the checkpoint's chat template when it has one (instruct
checkpoints), and as a plain join of the contents otherwise (base models, the synthetic world).

BOS: `encode(text, add_bos=True)` gives exactly one leading BOS whatever the text holds. Llama-3 chat templates
already begin with `<|begin_of_text|>` (the BOS, tokenized as its special id), so the rendered prompt keeps that
one and no second is added; a template without BOS (Qwen2, the plain join) gets one prepended when the
tokenizer has a BOS at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence

import sentencepiece as spm


class Tokenizer(Protocol):
    bos_id: int | None
    eos_id: int | None
    pad_id: int
    vocab_size: int

    @property
    def eos_ids(self) -> tuple[int, ...]: ...
    def encode(self, text: str, add_bos: bool = False) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str: ...


def _plain_chat(messages: list[dict]) -> str:
    return "\n\n".join(m["content"] for m in messages)


def with_one_bos(ids: list[int], bos_id: int | None, add_bos: bool) -> list[int]:
    """`ids` with exactly one leading BOS when `add_bos` (none added if the text already began with it;
    repeated leading BOS collapse to one); unchanged when not `add_bos` or the tokenizer has no BOS."""
    if not add_bos or bos_id is None:
        return ids
    i = 0
    while i < len(ids) and ids[i] == bos_id:
        i += 1
    return [bos_id] + ids[i:]


class SentencePieceTokenizer:
    """A sentencepiece *.model file (trained by jaxrag for the synthetic world, or Llama-2-style models)."""

    def __init__(self, path: str | Path):
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no sentencepiece model")
        self.sp = spm.SentencePieceProcessor(model_file=str(path))
        self.path = path
        self.vocab_size = self.sp.get_piece_size()
        self.bos_id = self.sp.bos_id() if self.sp.bos_id() >= 0 else None
        self.eos_id = self.sp.eos_id() if self.sp.eos_id() >= 0 else None
        self.pad_id = self.sp.pad_id() if self.sp.pad_id() >= 0 else 0

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return () if self.eos_id is None else (self.eos_id,)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        return with_one_bos(self.sp.encode(text), self.bos_id, add_bos)

    def decode(self, ids: Sequence[int]) -> str:
        specials = {self.bos_id, self.eos_id, self.pad_id}
        return self.sp.decode([int(i) for i in ids if int(i) not in specials])

    def chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return _plain_chat(messages)


class HFTokenizer:
    """A transformers tokenizer loaded from a local directory (tokenizer.json / tokenizer_config.json)."""

    def __init__(self, path: str | Path):
        from transformers import AutoTokenizer

        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no tokenizer directory")
        self.tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.path = path
        self.vocab_size = len(self.tok)
        self.bos_id = self.tok.bos_token_id
        self.eos_id = self.tok.eos_token_id
        self.pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else (self.eos_id or 0)
        self.has_chat_template = bool(getattr(self.tok, "chat_template", None))

    @property
    def eos_ids(self) -> tuple[int, ...]:
        ids = {self.eos_id} if self.eos_id is not None else set()
        for name in ("<|eot_id|>", "<|im_end|>", "<|end_of_text|>"):  # Llama-3 / Qwen2 turn ends
            tid = self.tok.convert_tokens_to_ids(name) if name in self.tok.get_vocab() else None
            if tid is not None:
                ids.add(tid)
        return tuple(sorted(ids))

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        return with_one_bos(self.tok.encode(text, add_special_tokens=False), self.bos_id, add_bos)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not self.has_chat_template:
            return _plain_chat(messages)
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A *.model file (or a dir holding only tokenizer.model) -> sentencepiece; a HF dir -> transformers."""
    path = Path(path)
    if path.is_file() and path.suffix == ".model":
        return SentencePieceTokenizer(path)
    if path.is_dir():
        if (path / "tokenizer.json").exists() or (path / "tokenizer_config.json").exists():
            return HFTokenizer(path)
        if (path / "tokenizer.model").exists():
            return SentencePieceTokenizer(path / "tokenizer.model")
    raise FileNotFoundError(f"{path}: neither a sentencepiece *.model nor a Hugging Face tokenizer directory")
