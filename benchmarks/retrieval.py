"""Retrieval quality and speed, peers measured in the same run.

    python -m benchmarks.retrieval [--quick] [--max-passages N] [--questions N] [--synthetic N]

1. Quality on real data: recall@1/5/10 of gold supporting paragraphs (matched by title), question as query, for
   BM25 (bm25s and Lucene), dense (MiniLM in JAX, exact search) and RRF, over corpus_multihop_contexts.jsonl
   with the HotpotQA / 2Wiki / MuSiQue dev questions. Top-10 agreement of bm25s with Lucene.
2. Encoder throughput: JAX (length buckets) vs transformers/PyTorch (batch 128, max length 256, padded to the
   longest in the batch), same passages, same run.
3. Throughput on a generated corpus (default 100k passages): Lucene batch search vs bm25s vs rank-bm25 (on a
   subsample: it scores every document in Python), and ScaNN vs exact search on clustered embeddings.

Corpus embeddings are cached under runs/bench_retrieval/ (keyed by corpus slice and encoder), so reruns skip
the multi-minute encode. --quick: 60 questions per dataset, a corpus of their context paragraphs, 20k synthetic.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import table, write_result
from jaxrag.paths import bench_data
from jaxrag.retrieval.ann import AnnConfig, ExactIndex, ScannIndex
from jaxrag.retrieval.bm25 import build_bm25
from jaxrag.retrieval.corpus import Passage, load_corpus
from jaxrag.retrieval.hybrid import rrf

BENCH = bench_data()   # the full benchmark files, else the repository's slices (printed)
DATASETS = {
    "hotpotqa": "hotpotqa_dev_500.jsonl",
    "2wiki": "2wikimultihopqa_dev_164.jsonl",
    "musique": "musique_ans_dev_200.jsonl",
}
CACHE = Path("runs/bench_retrieval")
DEPTHS = (10, 20, 50, 100)  # RRF list cuts compared; load_retriever defaults to 20


def log(msg: str) -> None:
    print(f"[benchmarks.retrieval {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def qps(n: int, seconds: float) -> float:
    return n / max(seconds, 1e-9)


# ---------------------------------------------------------------- 1. quality on real data


def load_questions(limit: int | None) -> dict[str, list[dict]]:
    out = {}
    for name, file in DATASETS.items():
        rows = [json.loads(l) for l in (BENCH / file).open()]
        out[name] = rows[:limit] if limit else rows
    return out


def restrict_corpus(passages: list[Passage], questions: dict[str, list[dict]]) -> list[Passage]:
    """--quick: only the context paragraphs of the chosen questions (gold + the datasets' own distractors)."""
    titles = {c["title"] for rows in questions.values() for q in rows for c in q.get("contexts", [])}
    return [p for p in passages if p.title in titles]


def recall_at(hit_lists, questions, ks=(1, 5, 10)) -> dict[str, float]:
    out = {}
    for k in ks:
        per_q = []
        for hits, q in zip(hit_lists, questions):
            gold = set(q["supporting_titles"])
            per_q.append(len(gold & {h.title for h in hits[:k]}) / len(gold))
        out[f"R@{k}"] = float(np.mean(per_q))
    return out


def top10_overlap(a, b) -> float:
    return float(np.mean([len({h.doc_id for h in x[:10]} & {h.doc_id for h in y[:10]}) / 10 for x, y in zip(a, b)]))


def corpus_embeddings(passages: list[Passage], encoder) -> tuple[np.ndarray, dict]:
    key = hashlib.sha1(("|".join(p.doc_id for p in passages) + json.dumps(encoder.meta())).encode()).hexdigest()[:12]
    path = CACHE / f"emb_{key}.npy"
    if path.exists():
        log(f"corpus embeddings from cache {path}")
        return np.load(path), {"cached": True}
    t0 = time.perf_counter()
    emb = encoder.encode_passages(passages, progress=True)
    seconds = time.perf_counter() - t0
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(path, emb)
    return emb, {"cached": False, "seconds": seconds, "passages_per_s": qps(len(passages), seconds)}


def quality(passages, questions, encoder) -> dict:
    from jaxrag.retrieval.base import ScorerRetriever
    from jaxrag.retrieval.dense import DenseScorer

    log(f"quality: {len(passages)} passages, " + ", ".join(f"{k}={len(v)}" for k, v in questions.items()))
    t0 = time.perf_counter()
    bm25s = build_bm25(passages, "bm25s")
    lucene = build_bm25(passages, "lucene")
    log(f"bm25 indexes built in {time.perf_counter() - t0:.1f}s; encoding corpus")
    emb, encode_info = corpus_embeddings(passages, encoder)
    dense = ScorerRetriever(DenseScorer(encoder, ExactIndex(emb)), passages)
    rows, results = [], {"corpus_encode": encode_info}
    for name, qs in questions.items():
        texts = [q["question"] for q in qs]
        lists = {
            "bm25s": bm25s.search(texts, 100),
            "lucene": lucene.search(texts, 100),
            "dense": dense.search(texts, 100),
        }
        res = {m: recall_at(l, qs) for m, l in lists.items()}
        for depth in DEPTHS:
            fused = [rrf([b, d], k=10, depth=depth) for b, d in zip(lists["bm25s"], lists["dense"])]
            res[f"rrf@depth{depth}"] = recall_at(fused, qs)
        res["bm25s_vs_lucene_top10_overlap"] = top10_overlap(lists["bm25s"], lists["lucene"])
        results[name] = res
        for method, r in res.items():
            if isinstance(r, dict):
                rows.append({"dataset": name, "method": method, **r})
    print(table(rows, ["dataset", "method", "R@1", "R@5", "R@10"]))
    print(
        "bm25s vs Lucene top-10 overlap: "
        + ", ".join(f"{n} {results[n]['bm25s_vs_lucene_top10_overlap']:.3f}" for n in questions)
    )
    return results


# ---------------------------------------------------------------- 2. encoder throughput


def encoder_throughput(passages, encoder, n: int) -> dict:
    import torch
    from transformers import AutoTokenizer, BertModel

    pick = np.random.default_rng(0).choice(len(passages), min(n, len(passages)), replace=False)
    sample = [passages[i] for i in pick]  # random: the corpus file is grouped by source
    texts = [p.full_text() for p in sample]
    encoder.encode_passages(sample, progress=False)  # compile every bucket used
    t0 = time.perf_counter()
    ours = encoder.encode_passages(sample, progress=False)
    jax_s = time.perf_counter() - t0
    model = BertModel.from_pretrained(str(encoder.path)).eval()
    tok = AutoTokenizer.from_pretrained(str(encoder.path))
    t0 = time.perf_counter()
    ref = []
    with torch.inference_mode():
        for s in range(0, len(texts), 128):
            b = tok(texts[s : s + 128], padding=True, truncation=True, max_length=256, return_tensors="pt")
            h = model(**b).last_hidden_state
            m = b["attention_mask"][..., None].float()
            ref.append(torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy())
    torch_s = time.perf_counter() - t0
    diff = float(np.abs(np.concatenate(ref) - ours).max())
    out = {
        "passages": len(sample),
        "jax_passages_per_s": qps(len(sample), jax_s),
        "torch_passages_per_s": qps(len(sample), torch_s),
        "speedup": torch_s / jax_s,
        "max_abs_diff": diff,
        "torch_threads": torch.get_num_threads(),
    }
    print(
        table(
            [
                {"encoder": "jax (buckets)", "passages/s": out["jax_passages_per_s"], "ratio": out["speedup"]},
                {"encoder": "torch (batch 128, len 256)", "passages/s": out["torch_passages_per_s"], "ratio": 1.0},
            ],
            ["encoder", "passages/s", "ratio"],
        )
    )
    return out


# ---------------------------------------------------------------- 3. throughput on a generated corpus


def synthetic_corpus(n: int, seed: int = 0, vocab: int = 30_000, length: int = 60):
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnoprstuvw"))
    words = np.array(["".join(rng.choice(letters, rng.integers(4, 10))) for _ in range(vocab)])
    p = 1.0 / np.arange(1, vocab + 1) ** 1.05
    ids = rng.choice(vocab, size=(n, length), p=p / p.sum())
    passages = [Passage(f"s{i}", " ".join(words[row[:3]]), " ".join(words[row[3:]])) for i, row in enumerate(ids)]
    picks = rng.integers(0, n, 2000)
    queries = [" ".join(words[rng.choice(ids[j], rng.integers(3, 7), replace=False)]) for j in picks]
    return passages, queries


def bm25_throughput(n: int, rank_bm25_docs: int) -> dict:
    from rank_bm25 import BM25Okapi

    from jaxrag.retrieval.bm25 import analyze

    log(f"bm25 throughput: generating {n} passages")
    passages, queries = synthetic_corpus(n)
    rows, out = [], {"passages": n, "queries": len(queries)}
    built = {}
    for backend in ("lucene", "bm25s"):
        t0 = time.perf_counter()
        built[backend] = build_bm25(
            passages, backend, Path(tempfile.mkdtemp(prefix="bench_lucene_")) if backend == "lucene" else None
        )
        build_s = time.perf_counter() - t0
        built[backend].search(queries[:200], 10)  # warm up JIT (JVM / numba)
        t0 = time.perf_counter()
        hits = built[backend].search(queries, 10)
        search_s = time.perf_counter() - t0
        out[backend] = {"build_s": build_s, "qps": qps(len(queries), search_s), "hits": hits}
    out["top10_overlap"] = top10_overlap(out["lucene"].pop("hits"), out["bm25s"].pop("hits"))
    sub = passages[:rank_bm25_docs]
    t0 = time.perf_counter()
    okapi = BM25Okapi([analyze(p.full_text()) for p in sub], k1=0.9, b=0.4)
    build_s = time.perf_counter() - t0
    qs = queries[:50]
    t0 = time.perf_counter()
    for q in qs:
        np.argsort(-okapi.get_scores(analyze(q)))[:10]
    out["rank_bm25"] = {
        "build_s": build_s,
        "qps": qps(len(qs), time.perf_counter() - t0),
        "docs": len(sub),
        "queries": len(qs),
    }
    base = out["lucene"]["qps"]
    for name, label in (
        ("lucene", "Lucene (pyserini jar, 2 threads)"),
        ("bm25s", "bm25s (numba, default)"),
        ("rank_bm25", f"rank-bm25 (on {len(sub)} docs, {len(qs)} queries)"),
    ):
        rows.append(
            {
                "backend": label,
                "build s": out[name]["build_s"],
                "queries/s": out[name]["qps"],
                "vs Lucene": out[name]["qps"] / base,
            }
        )
    print(table(rows, ["backend", "build s", "queries/s", "vs Lucene"]))
    print(f"bm25s vs Lucene top-10 overlap on the generated corpus: {out['top10_overlap']:.3f}")
    return out


def ann_throughput(n: int, dim: int = 384, n_queries: int = 1000, clusters: int = 1000) -> dict:
    rng = np.random.default_rng(1)
    centers = rng.normal(size=(clusters, dim)).astype(np.float32)

    def draw(m):
        x = centers[rng.integers(0, clusters, m)] + 0.5 * rng.normal(size=(m, dim)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    emb, q = draw(n), draw(n_queries)
    exact = ExactIndex(emb)
    t0 = time.perf_counter()
    truth, _ = exact.search(q, 10)
    exact_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    scann = ScannIndex.build(emb, AnnConfig(kind="scann"))
    build_s = time.perf_counter() - t0
    scann.search(q[:100], 10)
    t0 = time.perf_counter()
    got, _ = scann.search(q, 10)
    scann_s = time.perf_counter() - t0
    recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, truth)]))
    out = {
        "vectors": n,
        "dim": dim,
        "queries": n_queries,
        "exact_qps": qps(n_queries, exact_s),
        "scann_qps": qps(n_queries, scann_s),
        "scann_recall@10": recall,
        "scann_build_s": build_s,
        "scann_params": scann.describe(),
    }
    print(
        table(
            [
                {"search": "exact (numpy)", "recall@10": 1.0, "queries/s": out["exact_qps"], "ratio": 1.0},
                {
                    "search": "ScaNN tree+AH+reorder",
                    "recall@10": recall,
                    "queries/s": out["scann_qps"],
                    "ratio": out["scann_qps"] / out["exact_qps"],
                },
            ],
            ["search", "recall@10", "queries/s", "ratio"],
        )
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-passages", type=int, default=None, help="cut the real corpus (gold may go missing)")
    ap.add_argument("--questions", type=int, default=None, help="questions per dataset (default: all)")
    ap.add_argument("--synthetic", type=int, default=None, help="generated corpus size (default 100k)")
    ap.add_argument("--encoder-sample", type=int, default=None, help="passages for the JAX vs torch encode race")
    a = ap.parse_args()
    n_questions = a.questions or (60 if a.quick else None)
    n_synth = a.synthetic or (20_000 if a.quick else 100_000)
    t_start = time.perf_counter()

    from jaxrag.retrieval.dense import TextEncoder

    questions = load_questions(n_questions)
    passages = load_corpus(BENCH / "corpus_multihop_contexts.jsonl", a.max_passages)
    if a.quick:
        passages = restrict_corpus(passages, questions)
    encoder = TextEncoder.load(max_len=256, batch_size=128)
    log(f"data: {BENCH}")
    result = {"args": vars(a), "data": str(BENCH), "corpus_passages": len(passages)}
    result["quality"] = quality(passages, questions, encoder)
    result["encoder"] = encoder_throughput(passages, encoder, a.encoder_sample or (256 if a.quick else 512))
    result["bm25_throughput"] = bm25_throughput(n_synth, rank_bm25_docs=min(n_synth, 10_000))
    result["ann"] = ann_throughput(n_synth)
    result["total_s"] = time.perf_counter() - t_start
    path = write_result("retrieval", result)
    log(f"done in {result['total_s']:.0f}s; wrote {path}")


if __name__ == "__main__":
    main()
