"""The synthetic world: determinism, split disjointness, gold chains, JSONL export, tokenizer."""


import pytest

from jaxrag.data.synthetic import export, questions as Q, spm, world as W
from jaxrag.jsonl import read_jsonl

SMALL = dict(n_countries=5, n_cities=20, n_persons=80, n_films=40, n_companies=20)


@pytest.fixture(scope="module")
def small():
    w = W.generate_world(3, **SMALL)
    return w, Q.generate_questions(w, seed=3)


def test_same_seed_same_world_other_seed_differs():
    a, b, c = (W.generate_world(s, **SMALL) for s in (1, 1, 2))
    assert export.corpus_records(a) == export.corpus_records(b)
    assert Q.generate_questions(a, seed=1) == Q.generate_questions(b, seed=1)
    assert export.corpus_records(a) != export.corpus_records(c)


def test_names_unique_and_facts_one_passage_each(small):
    w, _ = small
    names = [e.name.lower() for e in w.entities.values()]
    assert len(names) == len(set(names))
    assert len({p.id for p in w.passages}) == len(w.passages) == len(w.facts)
    for (s, rel), fact in w.facts.items():
        p = w.passage(fact.passage_id)
        assert p.title == w.entities[s].name and w.entities[s].name in p.contents and w.name(fact.object) in p.contents


def test_names_are_shared_between_people(small):
    w, _ = small
    firsts = [e.name.split()[0] for e in w.of_type("person")]
    assert len(set(firsts)) < len(firsts)  # distractors share names


def test_gold_chain_passages_exist_and_contain_answers(small):
    w, qs = small
    assert {q["metadata"]["type"] for q in qs} == {"1hop", "2hop", "3hop", "comparison"}
    for q in qs:
        chain = q["metadata"]["gold_chain"]
        assert len(chain) == q["metadata"]["hops"] >= 1
        for h in chain:
            p = w.passage(h["passage_id"])
            assert p.title == h["title"] and h["entity"] in p.contents and h["answer"] in p.contents
            assert not p.distractor
        assert q["supporting_titles"] == list(dict.fromkeys(h["title"] for h in chain))
        if q["metadata"]["type"] == "comparison":
            years = [int(h["answer"]) for h in chain]
            assert years[0] != years[1]
            assert q["golden_answers"] == [chain[years.index(min(years))]["entity"]]
        else:
            assert q["golden_answers"] == [chain[-1]["answer"]]
            for prev, nxt in zip(chain, chain[1:]):  # each hop starts from the previous hop's answer
                assert nxt["entity"] == prev["answer"]
            assert chain[0]["entity"] in q["question"]


def test_splits_disjoint_and_heldout_names_new(small):
    w, qs = small
    parts = Q.by_split(qs)
    assert all(parts[s] for s in Q.SPLITS)
    assert len({q["id"] for q in qs}) == len(qs)
    anchors = {s: {q["metadata"]["anchor"] for q in parts[s]} for s in Q.SPLITS}
    compositions = {s: {(q["metadata"]["anchor"], tuple(q["metadata"]["chain"])) for q in parts[s]} for s in Q.SPLITS}
    for i, a in enumerate(Q.SPLITS):
        for b in Q.SPLITS[i + 1 :]:
            assert not anchors[a] & anchors[b], (a, b)
            assert not compositions[a] & compositions[b], (a, b)
    heldout_names = {e.name for e in w.entities.values() if e.heldout}
    assert heldout_names
    for q in parts["heldout"]:  # every person/film/company on a held-out chain is held out
        for h in q["metadata"]["gold_chain"]:
            for ref in (q["metadata"]["anchor"], h["answer_ref"]):
                if ref in w.entities and w.entities[ref].type in ("person", "film", "company"):
                    assert w.entities[ref].heldout, q["id"]
    for q in parts["train"] + parts["dev"] + parts["test"]:
        assert not any(n in q["question"] for n in heldout_names), q["id"]


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="n_cities"):
        W.generate_world(0, n_cities=1)
    with pytest.raises(ValueError, match="fractions"):
        Q.assign_splits(W.generate_world(0, **SMALL), fractions=(0.5, 0.5, 0.5))


def test_export_roundtrip_matches_real_data_format(small, tmp_path):
    w, qs = small
    paths = export.export_world(w, qs, str(tmp_path))
    corpus = read_jsonl(paths["corpus"])
    assert corpus and all(set(r) == {"id", "title", "contents"} for r in corpus)
    ids = {r["id"] for r in corpus}
    n = 0
    for split in Q.SPLITS:
        recs = read_jsonl(paths[split])
        n += len(recs)
        for r in recs:
            assert {"id", "question", "golden_answers", "supporting_titles", "metadata"} <= set(r) and r[
                "split"
            ] == split
            assert {"type", "hops", "gold_chain"} <= set(r["metadata"])
            assert all(h["passage_id"] in ids for h in r["metadata"]["gold_chain"])
    assert n == len(qs)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        read_jsonl(str(bad))


def test_sentencepiece_keeps_tags_whole_and_roundtrips(small, tmp_path):
    import sentencepiece

    w, qs = small
    texts = [p.contents for p in w.passages] + [q["question"] for q in qs]
    path = spm.train_sentencepiece(texts, str(tmp_path / "syn.model"), vocab_size=600)
    sp = sentencepiece.SentencePieceProcessor(model_file=path)
    assert 300 <= sp.vocab_size() <= 600
    for tag in ("<search>", "</search>", "<answer>", "</answer>"):
        assert len(sp.encode(tag)) == 1 or sp.encode(tag)[-1] == sp.piece_to_id(tag)
        assert sp.piece_to_id(tag) != sp.unk_id()
    text = "<search> " + w.passages[0].contents + " </search>"
    assert sp.decode(sp.encode(text)) == text
    with pytest.raises(ValueError, match=".model"):
        spm.train_sentencepiece(texts, str(tmp_path / "x.bin"))
