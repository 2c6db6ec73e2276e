"""Rebuild this folder's slices from the full benchmark files.

    python data/benchmarks/make_sample.py /path/to/full/benchmarks

Each QA file here is the first records of the same-named full file (the counts are in NOTICE.md); the corpus is the
full corpus's first 2,000 passages plus every passage of a sampled question's contexts, in the full corpus's order.
Same names as the full files, so a config reading `$JAXRAG_BENCHMARKS/<file>` runs on the slice when the variable
points here. Writes NOTICE.md's table of record counts and sha256 digests of the sources.
"""

import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
QA = {  # file: records kept (the first ones)
    "hotpotqa_dev_500.jsonl": 100,
    "2wikimultihopqa_dev_164.jsonl": 50,
    "musique_ans_dev_200.jsonl": 50,
    "2wikimultihopqa_dev_500_r1searcher_qonly.jsonl": 100,
    "musique_ans_dev_500_r1searcher_qonly.jsonl": 100,
    "bamboogle_test.jsonl": 100,
    "medqa_usmle_4opt_test_1273.jsonl": 100,
    "popqa_2000.jsonl": 100,
}
CORPUS = "corpus_multihop_contexts.jsonl"
CORPUS_HEAD = 2000


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _key(title: str, text: str) -> tuple[str, str]:
    return title, " ".join(text.split())


def main(src: Path) -> None:
    rows = {}
    wanted = set()
    for name, n in QA.items():
        lines = _lines(src / name)[:n]
        rows[name] = lines
        for line in lines:
            wanted |= {_key(c["title"], c["text"]) for c in json.loads(line).get("contexts", [])}
    kept = []
    for i, line in enumerate(_lines(src / CORPUS)):
        r = json.loads(line)
        if i < CORPUS_HEAD or _key(r["title"], r["contents"]) in wanted:
            kept.append(line)
    rows[CORPUS] = kept
    table = []
    for name, lines in rows.items():
        (HERE / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        digest = hashlib.sha256((src / name).read_bytes()).hexdigest()
        total = len(_lines(src / name))
        table.append(f"| {name} | {len(lines)} of {total} | {digest} |")
    print("\n".join(table))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
