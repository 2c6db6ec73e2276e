"""A TFDS builder over QA JSONL files (array_record, no TensorFlow) and a grain pipeline on top.

build_qa_tfds(jsonl, data_dir) writes the dataset once; qa_source(...) opens it as a random-access
data source; qa_loader(...) gives shuffled, repeated, batched dict records through grain.
"""
from __future__ import annotations

import json
from pathlib import Path

import tensorflow_datasets as tfds

from jaxrag.data.qa import load_qa


class QaJsonlConfig(tfds.core.BuilderConfig):
    def __init__(self, *, path: str, select: str | None = None, **kw):
        super().__init__(**kw)
        self.path, self.select = path, select


class QaJsonl(tfds.core.GeneratorBasedBuilder):
    """One split 'train' holding the (selected) records of one FlashRAG-style JSONL file."""
    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = []

    def _info(self):
        f = tfds.features
        return self.dataset_info_from_configs(features=f.FeaturesDict({
            "id": f.Text(), "question": f.Text(), "golden_answers": f.Sequence(f.Text()),
            "choices": f.Sequence(f.Text()), "contexts_json": f.Text(), "dataset": f.Text()}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for ex in load_qa(self.builder_config.path, self.builder_config.select):
            yield ex.id, {"id": ex.id, "question": ex.question, "golden_answers": list(ex.golden_answers),
                          "choices": list(ex.choices), "contexts_json": json.dumps(list(ex.contexts), ensure_ascii=False),
                          "dataset": ex.dataset}


def build_qa_tfds(jsonl: str | Path, data_dir: str | Path, name: str | None = None, select: str | None = None) -> QaJsonl:
    """Build (or reuse) the array_record dataset for `jsonl` under `data_dir`; returns the builder."""
    name = name or Path(jsonl).stem.replace("-", "_").replace(".", "_")
    cfg = QaJsonlConfig(name=name, path=str(jsonl), select=select, version=QaJsonl.VERSION)
    builder = QaJsonl(config=cfg, data_dir=str(data_dir), file_format="array_record")
    builder.download_and_prepare(file_format="array_record")
    return builder


def decode(rec: dict) -> dict:
    """TFDS bytes -> python strings; contexts back to a list of dicts."""
    s = lambda v: v.decode("utf-8") if isinstance(v, bytes) else str(v)
    return {"id": s(rec["id"]), "question": s(rec["question"]),
            "golden_answers": [s(x) for x in rec["golden_answers"]], "choices": [s(x) for x in rec["choices"]],
            "contexts": json.loads(s(rec["contexts_json"])), "dataset": s(rec["dataset"])}


def qa_source(builder: QaJsonl, split: str = "train"):
    return builder.as_data_source(split=split)


def qa_loader(source, *, batch_size: int, seed: int = 0, shuffle: bool = True, num_epochs: int | None = 1,
              transform=decode):
    """grain MapDataset: (shuffle per epoch) -> decode -> batch (lists of records, last batch kept)."""
    import grain
    ds = grain.MapDataset.source(source)
    if num_epochs is None or num_epochs > 1:
        ds = ds.repeat(num_epochs)
    if shuffle:
        ds = ds.shuffle(seed=seed)
    ds = ds.map(transform)
    return ds.batch(batch_size, drop_remainder=False, batch_fn=list)
