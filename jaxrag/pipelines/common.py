"""What every stage shares: its output directory, atomic JSON writes, one-line logging, model checkpoints.

A stage is `fn(config, workdir, name)`: `config[name]` is its own section; it reads its inputs from other stages'
directories under `workdir` and writes its outputs under `workdir/<name>/` (jaxrag.main writes DONE after it
returns). Model checkpoints are one format everywhere: a Hugging Face directory (config.json + safetensors, via
jaxrag.models.save_hf) with its tokenizer beside the weights, so every stage and every pipeline can read every
other's models (`load_checkpoint`; `load_policy` for a sampling policy from a config section).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from jaxrag import retrieval
from jaxrag.env.agents import get_agent
from jaxrag.jsonl import write_atomic
from jaxrag.models import load_hf, save_hf
from jaxrag.sampling import JaxPolicy, MIN_SHARED
from jaxrag.tokenizer import load_tokenizer
from jaxrag.train.distributed import barrier, is_lead, to_host


def config_fail(key: str, msg: str):
    """Raise the error of a stage's config check: `config.<key>: <msg>` (jaxrag.main shows it as one line)."""
    raise ValueError(f"config.{key}: {msg}")


def stage_dir(workdir, name: str) -> Path:
    p = Path(workdir) / name
    p.mkdir(parents=True, exist_ok=True)
    return p


def resolve(path: str, workdir) -> Path:
    """A config path: absolute, relative to the workdir, or "stage:<s>" = the model of stage <s> (workdir/<s>/model)."""
    if str(path).startswith("stage:"):
        return model_dir(workdir, str(path).split(":", 1)[1])
    p = Path(path)
    return p if p.is_absolute() else Path(workdir) / p


def plain(section):
    """A config section as plain Python (ConfigDict.to_dict); anything else as it is (dicts, lists, None)."""
    return section.to_dict() if hasattr(section, "to_dict") else section


def write_json(path, obj) -> Path:
    """JSON written to a temp file and renamed into place (jsonl.write_atomic): a killed write never leaves a half
    file, a failed one names the file and keeps the old one."""
    return write_atomic(path, lambda f: f.write(json.dumps(obj, indent=1)))


def read_json(path) -> dict:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing (has the stage that writes it run?)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: malformed JSON ({e.msg} at line {e.lineno})") from None


def log(name: str, msg: str) -> None:
    print(f"[{name}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------- checkpoints
def model_dir(workdir, stage: str) -> Path:
    """Where stage `stage` keeps its model: workdir/<stage>/model (a Hugging Face directory)."""
    return Path(workdir) / stage / "model"


# Files of a tokenizer directory that travel with every saved model: the tokenizer itself, its special tokens and chat
# template (without it a tuned chat model silently falls back to plain prompts), and the model's generation defaults.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "generation_config.json")


def tokenizer_files(src: Path) -> list[Path]:
    """The files of tokenizer dir `src` a saved model carries (TOKENIZER_FILES, tokenizer*, sentencepiece *.model)."""
    return sorted(f for f in src.iterdir() if f.is_file() and (
        f.name in TOKENIZER_FILES or f.name.startswith("tokenizer") or f.name.endswith(".model")))


def save_checkpoint(path, mcfg, params, tokenizer_file: str | Path | None = None, head=None,
                    dtype: str | None = None) -> Path:
    """save_hf(mcfg, params, dtype) into `path` (written beside and renamed into place), plus the tokenizer
    (a dir: `tokenizer_files`, its chat template and generation_config.json included; a sentencepiece *.model is
    copied as tokenizer.model) and a critic/value head (head.npz). dtype: None = the weights' own (save_hf).

    Every process calls it (multi-host: params sharded over other processes' devices are gathered, a collective);
    process 0 writes, and all wait at a barrier until the directory is in place, so no process reads a half-written
    model."""
    path = Path(path)
    host_params, host_head = to_host(params), (to_host(head) if head is not None else None)
    if is_lead():
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        save_hf(mcfg, host_params, tmp, dtype=dtype)
        if tokenizer_file is not None:
            src = Path(tokenizer_file)
            if src.is_dir():
                for f in tokenizer_files(src):
                    shutil.copy(f, tmp / f.name)
            else:
                shutil.copy(src, tmp / ("tokenizer.model" if src.suffix == ".model" else src.name))
        if host_head is not None:
            np.savez(tmp / "head.npz", **{k: np.asarray(v) for k, v in host_head.items()})
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    barrier(f"save_checkpoint:{path}")
    return path


def load_checkpoint(path, with_head: bool = False):
    """-> (ModelConfig, params[, head or None]) from a directory written by save_checkpoint (or any HF dir)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: no model checkpoint here (no config.json; has its stage run?)")
    cfg, params = load_hf(path)
    if not with_head:
        return cfg, params
    head = None
    if (path / "head.npz").exists():
        with np.load(path / "head.npz") as z:
            head = {k: z[k] for k in z.files}
    return cfg, params, head


# ------------------------------------------------------------------------------------ policy and retriever
def load_policy(pc, workdir):
    """A JaxPolicy from a config section (dict or ConfigDict): `path` (a HF checkpoint dir: absolute, relative to the
    workdir, or "stage:<s>"), optional `tokenizer` (a tokenizer dir / *.model; default: the checkpoint dir), `dtype`,
    `max_prompt_tokens` (agents render over-long prompts shorter), `top_k`, `top_p`, `add_bos`, and the cross-turn
    KV reuse pool (jaxrag.sampling.sessions; off unless set): `session_slots` (>= the rollout batch x n_candidates),
    `session_tokens` (per episode; default max_seq_len); `pool_tokens`: tokens per slot of the continuous-batching
    pool (sampling.continuous, used with rollout `continuous: True`; default max_seq_len) and `pool_sessions` (that
    pool keeps each episode's KV cache between turns; default off), `prefix_cache` (that pool outlives a call and
    new sessions fork from finished ones' rows: MCTS rollouts; default off), `min_shared` (both session kinds keep
    a common prefix of at least this many ids when a prompt does not extend the last one; default 16, 0 = off);
    `min_rows`, `min_prompt`:
    the sampler's shape floors (generate.sample; defaults 1 and 16).
    `policy.tokenizer_path` says where the tokenizer came from (stages copy it beside the models they train)."""
    if not pc.get("path"):
        raise ValueError("policy needs 'path' (a Hugging Face checkpoint dir, or stage:<name>)")
    path = resolve(pc["path"], workdir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"policy.path: {path} is not a checkpoint dir (no config.json; has its stage run?)")
    cfg, params = load_hf(path, dtype=pc.get("dtype") or None)
    tok_path = resolve(pc["tokenizer"], workdir) if pc.get("tokenizer") else path
    tok = load_tokenizer(tok_path)
    if tok.vocab_size > cfg.vocab_size:
        raise ValueError(f"policy: tokenizer {tok_path} has {tok.vocab_size} tokens but the model in {path} has "
                         f"vocab_size {cfg.vocab_size}")
    policy = JaxPolicy(cfg, params, tok, top_k=pc.get("top_k") or 0, top_p=pc.get("top_p") or 1.0,
                       add_bos=pc.get("add_bos", True), max_prompt_tokens=pc.get("max_prompt_tokens") or None,
                       session_slots=pc.get("session_slots") or 0, session_tokens=pc.get("session_tokens") or None,
                       pool_tokens=pc.get("pool_tokens") or None, pool_sessions=bool(pc.get("pool_sessions", False)),
                       prefix_cache=bool(pc.get("prefix_cache", False)),
                       min_shared=int(pc.get("min_shared", MIN_SHARED)), min_rows=pc.get("min_rows") or 1,
                       min_prompt=pc.get("min_prompt") or 16)
    policy.tokenizer_path = tok_path
    return policy


def load_retriever(rc, workdir):
    """A retriever from a config section: `index_dir` (a built index: jaxrag.retrieval.load_retriever with `kind`,
    `backend`; optional `encoder` / `query_encoder`: where the dense index's document / query encoder now lives,
    relative to the workdir, e.g. MedCPT's two; optional `rrf_k` and `depth` of the hybrid fusion) or `corpus` (a
    JSONL; BM25 built in memory over its first `max_passages`, 0 = all)."""
    if rc.get("index_dir"):
        enc, q_enc = rc.get("encoder"), rc.get("query_encoder")
        return retrieval.load_retriever(resolve(rc["index_dir"], workdir), kind=rc.get("kind") or "bm25",
                                        backend=rc.get("backend") or "bm25s",
                                        encoder_path=resolve(enc, workdir) if enc else None,
                                        query_encoder_path=resolve(q_enc, workdir) if q_enc else None,
                                        **{key: int(rc[key]) for key in ("rrf_k", "depth") if rc.get(key)})
    if rc.get("corpus"):
        passages = retrieval.load_corpus(resolve(rc["corpus"], workdir), rc.get("max_passages") or None)
        return retrieval.build_bm25(passages, backend=rc.get("backend") or "bm25s")
    raise ValueError("retriever needs 'index_dir' (a built index) or 'corpus' (a JSONL)")


def load_agent(ac, tokenizer):
    """The agent design of a stage's `agent` section (name, mode, max_docs, max_doc_chars, opts: the design's own
    fields, e.g. ARENA's stop_at); in chat mode it renders prompts with `tokenizer`'s chat template."""
    mode = ac.get("mode", "chat")
    opts = {**plain(ac.get("opts", None) or {}), "mode": mode,
            "max_doc_chars": ac.get("max_doc_chars") or None}  # 0 = no cut (the papers)
    if ac.get("max_docs"):
        opts["max_docs"] = ac.max_docs
    if mode == "chat":
        opts["tokenizer"] = tokenizer
    return get_agent(ac.name, **opts)
