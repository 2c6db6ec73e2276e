"""Write a World and its questions in the project's real-data JSONL formats (data/benchmarks/NOTICE.md)."""

from __future__ import annotations

import dataclasses
import os

from jaxrag.data.synthetic.questions import SPLITS, by_split
from jaxrag.data.synthetic.world import World
from jaxrag.jsonl import write_jsonl


def corpus_records(world: World) -> list[dict]:
    return [{"id": p.id, "title": p.title, "contents": p.contents} for p in world.passages]


def export_world(world: World, questions: list[dict], out_dir: str) -> dict[str, str]:
    """corpus.jsonl, entities.jsonl, passages_meta.jsonl and questions_<split>.jsonl under out_dir; returns paths."""
    paths = {
        "corpus": os.path.join(out_dir, "corpus.jsonl"),
        "entities": os.path.join(out_dir, "entities.jsonl"),
        "passages_meta": os.path.join(out_dir, "passages_meta.jsonl"),
    }
    write_jsonl(paths["corpus"], corpus_records(world))
    write_jsonl(paths["entities"], (dataclasses.asdict(e) for e in world.entities.values()))
    write_jsonl(paths["passages_meta"], (dataclasses.asdict(p) for p in world.passages))
    for split, qs in by_split(questions).items():
        paths[split] = os.path.join(out_dir, f"questions_{split}.jsonl")
        write_jsonl(paths[split], qs)
    return paths


def question_paths(out_dir: str) -> dict[str, str]:
    return {s: os.path.join(out_dir, f"questions_{s}.jsonl") for s in SPLITS}
