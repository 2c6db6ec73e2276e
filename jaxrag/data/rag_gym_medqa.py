"""RAG-Gym's MedQA training sample -> QA JSONL (jaxrag.data.qa's format).

RAG-Gym collects process rewards on 1,000 questions sampled from the MedQA (USMLE, 4 options) training set (001 §4,
App. B). Its released code ships that sample as dataset/medqa_train_1000.csv with the columns index, question, options
(a Python dict literal {'A': text, ..., 'D': text}) and answer (the gold letter). The MedQA tuned rows of
configs/rag_gym/{sft,dpo,ppo}.py read it as JSONL:

    python -m jaxrag.data.rag_gym_medqa RAG-Gym/dataset/medqa_train_1000.csv $WORKDIR/data/medqa_train_1000.jsonl

Each record: id "medqa_train_<index>", the question, choices in letter order, golden_answers [the gold option's text],
metadata.answer_idx the gold letter, dataset "medqa_usmle_4options", split "train". A malformed row is an error that
names the file and line; the output is written whole or not at all.
"""
from __future__ import annotations

import argparse
import ast
import csv
import json
from pathlib import Path

from jaxrag.data.qa import QADataError
from jaxrag.jsonl import write_atomic

COLUMNS = ("index", "question", "options", "answer")


def records(path: str | Path) -> list[dict]:
    """The CSV's rows as QA records (see the module doc)."""
    path = Path(path)
    out = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise QADataError(f"{path}: missing columns {missing} (has {reader.fieldnames})")
        for row in reader:
            where = f"{path}:{reader.line_num}"
            try:
                options = ast.literal_eval(row["options"])
            except (ValueError, SyntaxError) as e:
                raise QADataError(f"{where}: options is not a dict literal ({e})") from None
            if not isinstance(options, dict) or not options or not all(isinstance(v, str) for v in options.values()):
                raise QADataError(f"{where}: options must map letters to option texts, got {row['options'][:80]!r}")
            letters = sorted(options)
            answer = row["answer"].strip().upper()
            if answer not in options:
                raise QADataError(f"{where}: answer {row['answer']!r} is not one of the options {letters}")
            out.append({"id": f"medqa_train_{row['index'].strip()}", "question": row["question"],
                        "golden_answers": [options[answer]], "choices": [options[k] for k in letters],
                        "dataset": "medqa_usmle_4options", "split": "train",
                        "metadata": {"answer_idx": answer, "choice_labels": letters, "source": "RAG-Gym " + path.name}})
    if not out:
        raise QADataError(f"{path}: no rows")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="RAG-Gym's dataset/medqa_train_1000.csv")
    ap.add_argument("out", help="the QA JSONL to write")
    args = ap.parse_args(argv)
    recs = records(args.csv)
    write_atomic(args.out, lambda f: f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
    print(f"{len(recs)} questions -> {args.out}")


if __name__ == "__main__":
    main()
