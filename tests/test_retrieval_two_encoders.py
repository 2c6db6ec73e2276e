"""Two-encoder dense retrieval (MedCPT: a query encoder and an article encoder reading (title, text) pairs, CLS, no
normalization, inner product), with two tiny random BERTs that share all-MiniLM-L6-v2's WordPiece tokenizer."""

import json
import shutil

import numpy as np
import pytest
import torch

from jaxrag.pipelines.common import load_retriever as load_from_config
from jaxrag.retrieval import RetrievalIndexError, load_retriever
from jaxrag.retrieval.build import build_all
from jaxrag.retrieval.corpus import CorpusError, Passage, write_corpus
from jaxrag.retrieval.dense import default_encoder_path
from jaxrag.retrieval.prepare import PrepareError, prepare

PASSAGES = [
    Passage("d0", "Aspirin", "Aspirin irreversibly inhibits cyclooxygenase and reduces platelet aggregation."),
    Passage("d1", "Metformin", "Metformin lowers hepatic glucose production in type 2 diabetes."),
    Passage("d2", "Warfarin", "Warfarin antagonizes vitamin K; monitor the INR during therapy."),
    Passage("d3", "", "A passage without a title about the loop of Henle and furosemide."),
    Passage("d4", "Heparin", "Heparin activates antithrombin III. " * 12),  # cut at max_len
]
QUERIES = ["antiplatelet drug mechanism", "which drug needs INR monitoring", "diuretic acting on the loop of Henle"]
Q_LEN, D_LEN = 16, 48


def tiny_bert(path, seed):
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tf.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=128, type_vocab_size=2)
    model = tf.BertModel(cfg, add_pooling_layer=False).eval()
    with torch.no_grad():  # random segment embeddings, so a wrong type id changes the result
        model.embeddings.token_type_embeddings.weight.normal_(0, 1.0)
    model.save_pretrained(path)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(default_encoder_path() / f, path / f)
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("medcpt")
    query, article, other = (tiny_bert(root / name, seed) for name, seed in
                             (("query_enc", 0), ("article_enc", 1), ("other_query_enc", 2)))
    corpus = root / "corpus.jsonl"
    write_corpus(PASSAGES, corpus)
    two = dict(encoder_path=str(article), max_len=D_LEN, batch_size=8, query_encoder_path=str(query),
               query_max_len=Q_LEN, pooling="cls", normalize=False, pair_input=True)
    build_all(corpus, root / "idx", bm25=(), **two)
    return dict(root=root, query=query, article=article, other=other, corpus=corpus, two=two)


def torch_cls(path, texts, max_len):
    from transformers import AutoTokenizer, BertModel

    tok = AutoTokenizer.from_pretrained(str(path))
    model = BertModel.from_pretrained(str(path), add_pooling_layer=False).eval()
    if isinstance(texts[0], tuple):
        batch = tok([t for t, _ in texts], [x for _, x in texts], padding=True, truncation=True,
                    max_length=max_len, return_tensors="pt")
    else:
        batch = tok(texts, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).last_hidden_state[:, 0].numpy()


def test_scores_are_query_cls_dot_article_pair_cls(world):
    q = torch_cls(world["query"], QUERIES, Q_LEN)
    d = torch_cls(world["article"], [(p.title, p.text) for p in PASSAGES], D_LEN)
    expected = q @ d.T
    hits = load_retriever(world["root"] / "idx", "dense").search(QUERIES, len(PASSAGES))
    for row, hs in zip(expected, hits):
        assert [h.doc_id for h in hs] == [PASSAGES[i].doc_id for i in np.argsort(-row)]
        np.testing.assert_allclose([h.score for h in hs], np.sort(row)[::-1], rtol=1e-4, atol=1e-4)
    emb = np.load(world["root"] / "idx" / "dense" / "embeddings.npy")
    np.testing.assert_allclose(emb, d, atol=1e-4)
    assert not np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-2)  # raw CLS vectors, not normalized
    # the query encoder really differs from the article encoder on the same text
    assert not np.allclose(torch_cls(world["article"], QUERIES, Q_LEN), q, atol=1e-2)


def test_manifest_round_trip_and_moved_query_encoder(world, tmp_path):
    meta = json.loads((world["root"] / "idx" / "dense" / "meta.json").read_text())
    assert (meta["encoder"], meta["max_len"], meta["pooling"]) == (str(world["article"]), D_LEN, "cls")
    assert meta["normalize"] is False and meta["pair_input"] is True
    assert meta["query_encoder"] == {"encoder": str(world["query"]), "max_len": Q_LEN, "batch_size": 8,
                                     "pooling": "cls", "query_prefix": "", "passage_prefix": "",
                                     "normalize": False}
    scorer = load_retriever(world["root"] / "idx", "dense").inner.scorer
    enc = scorer.encoder
    assert (enc.path, enc.max_len, enc.cfg.pooling, enc.cfg.normalize) == (world["query"], Q_LEN, "cls", False)
    # a pipeline config names the encoders relative to the workdir (the recorded one moved there)
    workdir = tmp_path / "run"
    shutil.copytree(world["query"], workdir / "models" / "MedCPT-Query-Encoder")
    rc = {"index_dir": str(world["root"] / "idx"), "kind": "dense", "query_encoder": "models/MedCPT-Query-Encoder"}
    moved = load_from_config(rc, workdir)
    assert moved.inner.scorer.encoder.path == workdir / "models" / "MedCPT-Query-Encoder"
    assert [h.doc_id for h in moved.search(QUERIES, 3)[1]] == [
        h.doc_id for h in load_retriever(world["root"] / "idx", "dense").search(QUERIES, 3)[1]]


def test_one_encoder_index_is_unchanged(world, tmp_path):
    build_all(world["corpus"], tmp_path / "one", bm25=(), encoder_path=str(world["article"]), max_len=D_LEN,
              batch_size=8)
    meta = json.loads((tmp_path / "one" / "dense" / "meta.json").read_text())
    assert set(meta) == {"encoder", "max_len", "batch_size", "pooling", "query_prefix", "passage_prefix", "n", "dim",
                         "ann"}
    retriever = load_retriever(tmp_path / "one", "dense")
    assert retriever.inner.scorer.encoder.path == world["article"]
    emb = np.load(tmp_path / "one" / "dense" / "embeddings.npy")
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    hits = retriever.search(QUERIES[:1], 2)[0]
    q = retriever.inner.scorer.encoder.encode_queries(QUERIES[:1])[0]
    np.testing.assert_allclose([h.score for h in hits], np.sort(emb @ q)[::-1][:2], rtol=1e-5)
    with pytest.raises(RetrievalIndexError, match="built with one encoder"):
        load_retriever(tmp_path / "one", "dense", query_encoder_path=world["query"])


def test_missing_query_encoder_dir_is_named(world, tmp_path):
    idx = tmp_path / "idx"
    shutil.copytree(world["root"] / "idx", idx)
    meta = json.loads((idx / "dense" / "meta.json").read_text())
    gone = tmp_path / "nowhere" / "MedCPT-Query-Encoder"
    meta["query_encoder"]["encoder"] = str(gone)
    (idx / "dense" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(RetrievalIndexError, match=f"query encoder directory not found: {gone}"):
        load_retriever(idx, "dense")
    with pytest.raises(FileNotFoundError, match=f"query encoder directory not found: {gone}"):
        build_all(world["corpus"], tmp_path / "b", bm25=(), **{**world["two"], "query_encoder_path": str(gone)})
    with pytest.raises(PrepareError, match=f"query encoder directory not found: {gone}"):
        prepare(world["corpus"], tmp_path / "p", bm25=(), progress=False,
                **{**world["two"], "query_encoder_path": str(gone)})


def test_prepare_equals_build_and_refuses_a_changed_query_encoder(world, tmp_path):
    out = tmp_path / "prep"
    prepare(world["corpus"], out, bm25=(), shard_passages=2, progress=False, **world["two"])
    built = world["root"] / "idx" / "dense"
    np.testing.assert_allclose(np.load(out / "dense" / "embeddings.npy"), np.load(built / "embeddings.npy"),
                               atol=1e-5)
    assert json.loads((out / "dense" / "meta.json").read_text()) == json.loads((built / "meta.json").read_text())
    with pytest.raises(PrepareError, match=r"query_encoder\.encoder: .*query_enc' -> .*other_query_enc'"):
        prepare(world["corpus"], out, bm25=(), shard_passages=2, progress=False,
                **{**world["two"], "query_encoder_path": str(world["other"])})
    with pytest.raises(PrepareError, match=r"query_encoder\.max_len: 16 -> 8"):
        prepare(world["corpus"], out, bm25=(), shard_passages=2, progress=False,
                **{**world["two"], "query_max_len": 8})


def test_medrag_chunks_read_title_and_content():
    from jaxrag.retrieval.corpus import parse_record

    rec = {"id": "Anatomy_Gray_0", "title": "Anatomy_Gray", "content": "What is anatomy?",
           "contents": "Anatomy_Gray. What is anatomy?"}
    assert parse_record(rec, "f:1") == Passage("Anatomy_Gray_0", "Anatomy_Gray", "What is anatomy?")
    with pytest.raises(CorpusError, match="f:2: key 'content' of record '1' is not a string"):
        parse_record({"id": 1, "title": "t", "content": 3}, "f:2")


def test_query_encoder_of_another_width_is_refused(world, tmp_path):
    import transformers as tf

    wide = tmp_path / "wide"
    tf.BertModel(tf.BertConfig(vocab_size=30522, hidden_size=48, num_hidden_layers=1, num_attention_heads=4,
                               intermediate_size=64, max_position_embeddings=128),
                 add_pooling_layer=False).save_pretrained(wide)
    shutil.copy(world["query"] / "tokenizer.json", wide / "tokenizer.json")
    with pytest.raises(RetrievalIndexError, match=f"encoder {wide} gives 48-dim vectors, the index holds 32"):
        load_retriever(world["root"] / "idx", "dense", query_encoder_path=wide)


def test_build_cli_takes_the_two_encoder_options(world, tmp_path, capsys):
    from jaxrag.retrieval.build import main

    main(["--corpus", str(world["corpus"]), "--out", str(tmp_path / "cli"), "--bm25", "",
          "--encoder", str(world["article"]), "--max-len", str(D_LEN), "--batch-size", "8",
          "--query-encoder", str(world["query"]), "--query-max-len", str(Q_LEN),
          "--pooling", "cls", "--no-normalize", "--pair-input"])
    assert json.loads(capsys.readouterr().out)["dense"] is True
    built = world["root"] / "idx" / "dense"
    assert json.loads((tmp_path / "cli" / "dense" / "meta.json").read_text()) == json.loads(
        (built / "meta.json").read_text())
    np.testing.assert_allclose(np.load(tmp_path / "cli" / "dense" / "embeddings.npy"),
                               np.load(built / "embeddings.npy"), atol=1e-6)
