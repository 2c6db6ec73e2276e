"""The eval stage's default policy loader on a real (tiny, random) Hugging Face checkpoint + local tokenizer,
over the real HotpotQA questions and an in-memory BM25 built from a slice of the multihop contexts corpus."""

import csv
import json
import re

import ml_collections
import pytest

from fakes import BENCH, CORPUS
from jaxrag.data.qa import load_qa
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import read_episodes
from jaxrag.pipelines.common import load_policy
from jaxrag.pipelines.eval import eval_stage

N_QUESTIONS = 5
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} <|im_end|> {% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")


def _corpus_slice(examples, n_head: int = 300) -> list[dict]:
    """The first `n_head` passages plus every passage titled like a supporting title of `examples`."""
    gold = {t for ex in examples for t in ex.supporting_titles}
    out = []
    with open(CORPUS, encoding="utf-8") as f:
        for i, line in enumerate(f):
            r = json.loads(line)
            if i < n_head or r["title"] in gold:
                out.append({"id": r["id"], "title": r["title"], "contents": r["contents"]})
    return out


def _save_tokenizer(path, texts) -> int:
    """WordLevel tokenizer (whitespace split) over the words of `texts`, with a chat template; returns |V|."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for t in texts for w in t.split()} - set(SPECIALS))
    vocab = {w: i for i, w in enumerate(SPECIALS + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(path)
    return len(vocab)


def _save_model(path, vocab_size: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).eval().save_pretrained(path)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A workdir with model/ (checkpoint + tokenizer) and corpus.jsonl; runs the eval stage once."""
    wd = tmp_path_factory.mktemp("eval_hf")
    examples = load_qa(BENCH / "hotpotqa_dev_500.jsonl", f"first:{N_QUESTIONS}")
    passages = _corpus_slice(examples)
    with open(wd / "corpus.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(p) + "\n" for p in passages)
    texts = [ex.question for ex in examples] + [p["contents"] for p in passages[:50]]
    texts += ["Query: Answer: Documents: Question: the of a is"]
    vocab_size = _save_tokenizer(wd / "model", texts)
    _save_model(wd / "model", vocab_size)

    c = ml_collections.ConfigDict()
    c.stages = ["eval"]
    c.eval = ml_collections.ConfigDict({
        "fn": "jaxrag.pipelines.eval:eval_stage",
        "agents": [{"name": "react"}, {"name": "rag", "method": "RAG"}],      # chat mode: the model's template
        "datasets": [{"name": "HotpotQA", "path": str(BENCH / "hotpotqa_dev_500.jsonl"),
                      "select": f"first:{N_QUESTIONS}"}],
        "policy": {"path": "model", "max_prompt_tokens": 250},                 # relative to the workdir
        "retriever": {"corpus": str(wd / "corpus.jsonl")},
        "rollout": {"k": 3, "max_steps": 4, "max_new_tokens": 12, "batch_size": 8},
    })
    results = eval_stage(c, wd, "eval")
    return wd, examples, passages, vocab_size, results


def test_load_policy_reads_checkpoint_and_tokenizer(run):
    wd, _, _, vocab_size, _ = run
    pol = load_policy({"path": str(wd / "model"), "max_prompt_tokens": 250}, "/nowhere")   # absolute path
    assert pol.cfg.vocab_size == pol.tokenizer.vocab_size == vocab_size
    assert pol.cfg.n_layers == 1 and pol.cfg.d_model == 32 and pol.cfg.max_seq_len == 512
    assert set(pol.tokenizer.eos_ids) == {2, 4} and pol.tokenizer.bos_id == pol.cfg.bos_id == 1
    assert pol.sessions is None                         # cross-turn KV reuse only when the section asks for it
    kv = load_policy({"path": str(wd / "model"), "session_slots": 4, "session_tokens": 300}, "/nowhere")
    assert kv.keeps_sessions and (kv.sessions.slots, kv.sessions.max_len) == (4, 300)
    assert not pol.pool_sessions and not pol.continuous(2).keeps_sessions
    pooled = load_policy({"path": str(wd / "model"), "pool_sessions": True, "pool_tokens": 300}, "/nowhere")
    assert pooled.continuous(2).keeps_sessions and pooled.continuous(2).pool.max_len == 300
    assert not pooled.continuous(2).pool.prefix_cache and pooled.continuous(2).pool is not pooled.continuous(2).pool
    assert pooled.min_shared == 16 and kv.sessions.min_shared == 16
    cached = load_policy({"path": str(wd / "model"), "pool_sessions": True, "prefix_cache": True, "min_shared": 0},
                         "/nowhere")
    two = cached.continuous(2).pool
    assert two.prefix_cache and two.min_shared == 0 and cached.continuous(2).pool is two   # kept between calls
    three = cached.continuous(3).pool                                                     # other settings: a new one
    assert three is not two and cached._pool is three
    for method in ("react", "RAG"):                     # what the eval stage sampled
        for ep in read_episodes(wd / "eval" / f"{method}__HotpotQA.episodes.jsonl"):
            s = ep.steps[-1]
            assert s.action.raw == pol.tokenizer.decode(s.token_ids) and all(lp <= 0 for lp in s.logprobs)
    # over max_prompt_tokens the RAG agent rendered its prompt with fewer documents, question kept (the
    # full prompt with its k=3 documents does not fit); greedy parity with the stored prompt
    ep = read_episodes(wd / "eval" / "RAG__HotpotQA.episodes.jsonl")[0]
    s = ep.steps[-1]
    assert pol.prompt_fits(s.prompt, 12) and ep.question in s.prompt and "Document [2]" not in s.prompt
    full = get_agent("rag", tokenizer=pol.tokenizer).render(ep.state(len(ep.steps) - 1))
    assert "Document [2]" in full and not pol.prompt_fits(full, 12)
    assert pol.encode_prompt(s.prompt, 12) == pol.tokenizer.encode(s.prompt, add_bos=True)
    [[c]] = pol.generate([s.prompt], max_new_tokens=12)
    assert c.token_ids == s.token_ids and c.logprobs == pytest.approx(s.logprobs, abs=1e-4)


def test_missing_checkpoint_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'ckpt'} is not a checkpoint dir")):
        load_policy({"path": "ckpt"}, tmp_path)


def test_tokenizer_larger_than_model_vocab_is_refused(run, tmp_path):
    wd, _, _, vocab_size, _ = run
    _save_tokenizer(tmp_path / "big_tok", [" ".join(f"w{i}" for i in range(vocab_size))])
    with pytest.raises(ValueError, match=f"has {vocab_size + len(SPECIALS)} tokens .* vocab_size {vocab_size}"):
        load_policy({"path": "model", "tokenizer": str(tmp_path / "big_tok")}, wd)


def test_eval_files_exist_and_agree(run):
    wd, examples, _, _, results = run
    out = wd / "eval"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(m["method"], m["dataset"]) for m in lines] == [("react", "HotpotQA"), ("RAG", "HotpotQA")]
    rows = list(csv.reader((out / "table.csv").open()))
    assert rows[0] == ["Method", "HotpotQA EM", "HotpotQA F1", "Avg EM", "Avg F1"]
    assert [r[0] for r in rows[1:]] == ["react", "RAG"]
    md = (out / "table.md").read_text()
    for method, row, m in zip(["react", "RAG"], rows[1:], lines):
        eps = read_episodes(out / f"{method}__HotpotQA.episodes.jsonl")
        assert [ep.qid for ep in eps] == [ex.id for ex in examples]
        assert m == {"method": method, "dataset": "HotpotQA", **results[method]["HotpotQA"]}
        assert m["n"] == N_QUESTIONS and float(row[1]) == pytest.approx(100 * m["em"], abs=1e-3)
        assert f"| {method} | {100 * m['em']:.2f} | {100 * m['f1']:.2f} |" in md
        n_invalid_eps = sum(ep.done == "invalid" for ep in eps)
        assert m["done_invalid"] == pytest.approx(n_invalid_eps / N_QUESTIONS)
        assert m["answered"] == pytest.approx(sum(ep.answer is not None for ep in eps) / N_QUESTIONS)
        for ep in eps:
            assert ep.done in ("answer", "invalid", "max_steps") and 1 <= len(ep.steps) <= 4
            for s in ep.steps:
                if s.prompt:   # generated (not scripted) steps: chat template, tokens decode to the raw text
                    assert s.prompt.startswith("[system]") and s.prompt.endswith("[assistant] ")
                    assert len(s.token_ids) == len(s.logprobs) <= 12 and s.finish_reason in ("eos", "stop", "length")


def test_garbage_output_is_counted_invalid_not_crashed(run):
    wd, _, _, _, results = run
    eps = read_episodes(wd / "eval" / "react__HotpotQA.episodes.jsonl")
    assert results["react"]["HotpotQA"]["invalid_rate"] > 0
    bad = [s for ep in eps for s in ep.steps if s.action.kind == "invalid"]
    assert bad and all(s.action.extra.get("error") and s.action.text == "" for s in bad)
    assert all(ep.done == "invalid" for ep in eps if ep.steps[-1].action.kind == "invalid")
    assert results["react"]["HotpotQA"]["done_invalid"] > 0


def test_rag_searches_the_bm25_slice(run):
    wd, examples, passages, _, _ = run
    ids = {p["id"] for p in passages}
    title = {p["id"]: p["title"] for p in passages}
    eps = read_episodes(wd / "eval" / "RAG__HotpotQA.episodes.jsonl")
    found_gold = 0
    for ep, ex in zip(eps, examples):
        first = ep.steps[0]
        assert first.action.kind == "query" and first.action.extra.get("scripted")
        assert len(first.docs) == 3 and all(d.doc_id in ids for d in first.docs)
        found_gold += any(title[d.doc_id] in ex.supporting_titles for d in first.docs)
    assert found_gold >= 3   # BM25 on the question finds a gold paragraph for most questions
