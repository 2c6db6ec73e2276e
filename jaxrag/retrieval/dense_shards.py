"""Resumable sharded encoding for `prepare`: the normalized corpus is encoded `shard_passages` passages at a
time. Each shard's embeddings are written to <shard_dir>/NNNNN.npy through a temp file and a rename, and only
then recorded in <shard_dir>/done.json (itself replaced atomically), so a killed run restarts at its first
unrecorded shard and never takes a file it did not record (a half-written or unrecorded one is encoded again).
<shard_dir>/settings.json holds what the shards depend on; a rerun with other settings is refused.
`assemble` copies the finished shards, in order, into one embeddings.npy through a memory map.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from jaxrag.jsonl import write_atomic
from jaxrag.retrieval.corpus import Passage, parse_record
from jaxrag.settings import changed_keys, flatten

log = logging.getLogger(__name__)


class ShardSettingsError(RuntimeError):
    """Shards on disk were made with other settings than this run's."""


def describe_changes(old: dict, new: dict) -> str:
    a, b = flatten(old), flatten(new)
    return ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in changed_keys(old, new))


def shard_file(shard_dir: Path, i: int) -> Path:
    return shard_dir / f"{i:05d}.npy"


def _read_done(shard_dir: Path) -> dict[int, int]:
    path = shard_dir / "done.json"
    return {int(k): v for k, v in json.loads(path.read_text()).items()} if path.is_file() else {}


def _write_done(shard_dir: Path, done: dict[int, int]) -> None:
    write_atomic(shard_dir / "done.json", lambda f: json.dump({str(k): v for k, v in sorted(done.items())}, f))


def open_shards(shard_dir: Path, settings: dict) -> dict[int, int]:
    """Make or reopen a shard dir for `settings`; returns the recorded shards {index: rows} whose files are whole."""
    shard_dir.mkdir(parents=True, exist_ok=True)
    path = shard_dir / "settings.json"
    if path.is_file():
        old = json.loads(path.read_text())
        if changed_keys(old, settings):
            raise ShardSettingsError(f"{shard_dir} holds shards made with other settings "
                                     f"({describe_changes(old, settings)}); use a new output dir or delete that dir")
    else:
        write_atomic(path, lambda f: json.dump(settings, f, indent=2))
    done = {}
    for i, rows in _read_done(shard_dir).items():
        try:
            ok = np.load(shard_file(shard_dir, i), mmap_mode="r").shape[0] == rows
        except (OSError, ValueError):
            ok = False
        if ok:
            done[i] = rows
        else:
            log.warning("shard %d is recorded but its file is missing or wrong: encoding it again", i)
    return done


def iter_shards(corpus: Path, shard_passages: int, skip: set[int]) -> Iterator[tuple[int, list[Passage]]]:
    """(shard index, passages) for every shard not in `skip`, read from the normalized corpus; skipped shards'
    lines are counted, not parsed."""
    with corpus.open("rb") as f:
        shard, lines = 0, []
        for line_no, raw in enumerate(f, start=1):
            if shard not in skip:
                lines.append((line_no, raw))
            if line_no % shard_passages == 0:
                if shard not in skip:
                    yield shard, [parse_record(json.loads(r), f"{corpus}:{n}") for n, r in lines]
                shard, lines = shard + 1, []
        if lines:
            yield shard, [parse_record(json.loads(r), f"{corpus}:{n}") for n, r in lines]


def encode_shards(
    corpus: Path,
    shard_dir: Path,
    encoder,
    shard_passages: int,
    done: dict[int, int],
    bar=None,
    on_shard: Callable[[dict], None] | None = None,
) -> dict[int, int]:
    """Encode every shard not in `done` (dense.TextEncoder `encoder`), record each as it finishes; returns `done`
    completed. `on_shard(row)` gets each shard's timing row."""
    done = dict(done)
    for i, passages in iter_shards(corpus, shard_passages, set(done)):
        t0 = time.perf_counter()
        ids, types, n_cut = encoder.tokenize_passages(passages)
        emb = encoder.encode_ids(ids, bar=bar, types=types)
        final = shard_file(shard_dir, i)
        tmp = final.with_name(final.name + ".tmp")
        with tmp.open("wb") as f:
            np.save(f, emb)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(final)
        done[i] = len(passages)
        _write_done(shard_dir, done)
        if on_shard is not None:
            seconds = time.perf_counter() - t0
            on_shard({"shard": i, "passages": len(passages), "seconds": round(seconds, 3),
                      "passages_per_s": round(len(passages) / seconds, 1), "truncated": n_cut})
    return done


def assemble(shard_dir: Path, done: dict[int, int], out: Path) -> tuple[int, int]:
    """Shards 0..n-1 -> `out` ([N,D] float32 .npy, written through a temp file); returns its shape."""
    if sorted(done) != list(range(len(done))):
        raise RuntimeError(f"{shard_dir}: shards {sorted(done)} are not 0..{len(done) - 1}")
    shards = [np.load(shard_file(shard_dir, i), mmap_mode="r") for i in range(len(done))]
    shape = (sum(s.shape[0] for s in shards), shards[0].shape[1])
    tmp = out.with_name(out.name + ".tmp")
    emb = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=shape)
    start = 0
    for s in shards:
        emb[start : start + len(s)] = s
        start += len(s)
    emb.flush()
    del emb
    tmp.replace(out)
    return shape
