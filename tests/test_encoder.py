import json
import shutil

import numpy as np
import pytest
import torch

from jaxrag.models.encoder import embed, load_encoder
from jaxrag.paths import SAMPLE
from jaxrag.retrieval.corpus import load_corpus
from jaxrag.retrieval.dense import TextEncoder, default_encoder_path, model_prefixes

CORPUS = SAMPLE / "corpus_multihop_contexts.jsonl"


def torch_embed(model, batch, pooling):
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    if pooling == "cls":
        out = hidden[:, 0]
    else:
        m = batch["attention_mask"][..., None].float()
        out = (hidden * m).sum(1) / m.sum(1)
    return torch.nn.functional.normalize(out, dim=-1).numpy()


@pytest.fixture(scope="module")
def minilm():
    return TextEncoder.load(max_len=256, batch_size=16)


def test_minilm_matches_transformers_mean_pooling(minilm):
    from transformers import AutoTokenizer, BertModel

    passages = load_corpus(CORPUS, max_passages=40)
    texts = [p.full_text() for p in passages]
    assert any(minilm.tokenizer.encode(t).overflowing for t in texts)  # some are truncated
    ours = minilm.encode_passages(passages, progress=False)
    path = str(default_encoder_path())
    model = BertModel.from_pretrained(path).eval()
    batch = AutoTokenizer.from_pretrained(path)(
        texts, padding=True, truncation=True, max_length=256, return_tensors="pt"
    )
    ref = torch_embed(model, batch, "mean")
    assert ours.shape == (40, 384)
    np.testing.assert_allclose(ours, ref, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_bucketing_keeps_order_and_batch_independence(minilm):
    texts = ["short", "a somewhat longer query about Shirley Temple and her diplomatic career", "mid length text"]
    together = minilm.encode_queries(texts)
    alone = np.concatenate([minilm.encode_queries([t]) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    assert float(together[0] @ together[1]) < 0.99


@pytest.mark.parametrize("arch, pooling", [("bert", "cls"), ("roberta", "mean"), ("xlm-roberta", "cls")])
def test_tiny_random_models_match_transformers(arch, pooling, tmp_path):
    import transformers as tf

    kw = dict(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=80,
        pad_token_id=1,
    )
    cls = {
        "bert": (tf.BertConfig, tf.BertModel),
        "roberta": (tf.RobertaConfig, tf.RobertaModel),
        "xlm-roberta": (tf.XLMRobertaConfig, tf.XLMRobertaModel),
    }[arch]
    torch.manual_seed(0)
    model = cls[1](cls[0](**kw), add_pooling_layer=False).eval()
    model.save_pretrained(tmp_path)
    cfg, params = load_encoder(tmp_path, pooling=pooling)
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 120, (3, 17)).astype(np.int64)
    mask = np.ones_like(tokens)
    mask[1, 9:] = 0
    mask[2, 4:] = 0
    tokens[mask == 0] = 1
    ref = torch_embed(model, {"input_ids": torch.tensor(tokens), "attention_mask": torch.tensor(mask)}, pooling)
    np.testing.assert_allclose(np.asarray(embed(cfg, params, tokens, mask)), ref, atol=1e-5)


def test_load_errors_name_file_and_tensor(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "config.json")):
        load_encoder(tmp_path)
    src = default_encoder_path()
    shutil.copy(src / "config.json", tmp_path / "config.json")
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(src / "model.safetensors"))
    del tensors["encoder.layer.3.attention.self.key.bias"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(KeyError, match="encoder.layer.3.attention.self.key.bias"):
        load_encoder(tmp_path)
    (tmp_path / "config.json").write_text("{bad")
    with pytest.raises(ValueError, match="config.json: malformed JSON"):
        load_encoder(tmp_path)
    cfg = json.loads((src / "config.json").read_text())
    del cfg["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="lacks key 'hidden_size'"):
        load_encoder(tmp_path)


def test_prefixes_by_family(tmp_path):
    for name, expected in [("e5-small-v2", ("query: ", "passage: ")), ("all-MiniLM-L6-v2", ("", ""))]:
        (tmp_path / name).mkdir()
        assert model_prefixes(tmp_path / name) == expected
    (tmp_path / "bge-small-en-v1.5").mkdir()
    assert model_prefixes(tmp_path / "bge-small-en-v1.5")[0].startswith("Represent this sentence")
    (tmp_path / "custom").mkdir()
    (tmp_path / "custom" / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "Q: ", "document": "D: "}})
    )
    assert model_prefixes(tmp_path / "custom") == ("Q: ", "D: ")
