"""Questions over a World, each with gold answers and the gold chain (which passage resolves which hop).

Types: "1hop", "2hop" (compositional), "3hop", "comparison". Splits: every question anchored on a non-held-out
entity goes to the split of its anchor (train/dev/test drawn per anchor, so no composition of anchor and relation
chain is shared between splits; comparisons pair anchors of one split); questions anchored on held-out entities
(whose chains stay inside the held-out names) form the "heldout" split.
"""

from __future__ import annotations

import numpy as np

from jaxrag.data.synthetic.world import RELATIONS, World

CHAINS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("born_in",): ("Where was {a} born?", "In which city was {a} born?"),
    ("works_for",): ("Which company does {a} work for?", "Who is the employer of {a}?"),
    ("in_country",): ("In which country is {a}?", "Which country is {a} in?"),
    ("directed_by",): ("Who directed {a}?", "Who is the director of {a}?"),
    ("based_in",): ("Where is {a} based?", "In which city is {a} based?"),
    ("founded_by",): ("Who founded {a}?", "Who is the founder of {a}?"),
    ("born_in", "in_country"): ("In which country was {a} born?", "Which country was {a} born in?"),
    ("works_for", "based_in"): (
        "In which city is the employer of {a} based?",
        "Where is the company that employs {a} based?",
    ),
    ("directed_by", "born_in"): ("Where was the director of {a} born?", "In which city was the director of {a} born?"),
    ("directed_by", "works_for"): (
        "Which company does the director of {a} work for?",
        "Who employs the director of {a}?",
    ),
    ("based_in", "in_country"): ("In which country is {a} based?", "Which country is {a} based in?"),
    ("founded_by", "born_in"): ("Where was the founder of {a} born?", "In which city was the founder of {a} born?"),
    ("directed_by", "born_in", "in_country"): (
        "In which country was the director of {a} born?",
        "Which country was the director of {a} born in?",
    ),
    ("works_for", "based_in", "in_country"): (
        "In which country is the employer of {a} based?",
        "Which country is the company that employs {a} based in?",
    ),
    ("founded_by", "born_in", "in_country"): (
        "In which country was the founder of {a} born?",
        "Which country was the founder of {a} born in?",
    ),
}
COMPARISONS = {  # relation -> question templates; the answer is the entity with the smaller year
    "birth_year": ("Who was born earlier, {a} or {b}?", "Who is older, {a} or {b}?"),
    "released_in": ("Which film came out first, {a} or {b}?", "Which film was released earlier, {a} or {b}?"),
}
TYPE_OF_HOPS = {1: "1hop", 2: "2hop", 3: "3hop"}
SPLITS = ("train", "dev", "test", "heldout")


def _hop(world: World, subject: str, relation: str, hop: int) -> dict:
    fact = world.facts[(subject, relation)]
    return {
        "hop": hop,
        "passage_id": fact.passage_id,
        "title": world.name(subject),
        "entity": world.name(subject),
        "relation": relation,
        "answer": world.name(fact.object),
        "answer_ref": fact.object,
    }


def gold_chain(world: World, anchor: str, chain: tuple[str, ...]) -> list[dict] | None:
    """Walk `chain` from `anchor`; None when a fact is missing."""
    hops, subject = [], anchor
    for i, rel in enumerate(chain):
        if (subject, rel) not in world.facts:
            return None
        hops.append(_hop(world, subject, rel, i + 1))
        subject = world.facts[(subject, rel)].object
    return hops


def _record(
    qid: str,
    question: str,
    answer: str,
    hops: list[dict],
    qtype: str,
    split: str,
    anchor: str,
    heldout: bool,
    chain: tuple[str, ...],
) -> dict:
    titles = list(dict.fromkeys(h["title"] for h in hops))
    return {
        "id": qid,
        "question": question,
        "golden_answers": [answer],
        "supporting_titles": titles,
        "dataset": "synthetic",
        "split": split,
        "metadata": {
            "type": qtype,
            "hops": len(hops),
            "chain": list(chain),
            "gold_chain": hops,
            "anchor": anchor,
            "heldout": heldout,
        },
    }


def assign_splits(world: World, fractions=(0.8, 0.1, 0.1), seed: int = 0) -> dict[str, str]:
    """Entity id -> split for every anchor-able entity (held-out entities -> "heldout")."""
    if len(fractions) != 3 or abs(sum(fractions) - 1.0) > 1e-6 or min(fractions) < 0:
        raise ValueError(f"assign_splits: fractions={fractions} must be 3 non-negative numbers summing to 1")
    rng = np.random.default_rng([seed, 1])
    out = {}
    for e in world.entities.values():
        out[e.id] = "heldout" if e.heldout else str(rng.choice(SPLITS[:3], p=list(fractions)))
    return out


def generate_questions(
    world: World, fractions=(0.8, 0.1, 0.1), comparisons_per_anchor: float = 0.5, seed: int = 0
) -> list[dict]:
    """Every chain from every anchor it applies to, plus sampled comparison pairs within each split."""
    rng = np.random.default_rng([seed, 2])
    split_of = assign_splits(world, fractions, seed)
    out = []
    for chain, templates in CHAINS.items():
        anchor_type = RELATIONS[chain[0]][0]
        for ent in world.of_type(anchor_type):
            hops = gold_chain(world, ent.id, chain)
            if hops is None:
                continue
            question = templates[int(rng.integers(len(templates)))].format(a=ent.name)
            qtype = TYPE_OF_HOPS[len(chain)]
            qid = f"syn-{qtype}-{'-'.join(chain)}-{ent.id}"
            out.append(
                _record(qid, question, hops[-1]["answer"], hops, qtype, split_of[ent.id], ent.id, ent.heldout, chain)
            )
    for rel, templates in COMPARISONS.items():
        anchor_type = RELATIONS[rel][0]
        for split in SPLITS:
            ents = [e for e in world.of_type(anchor_type) if split_of[e.id] == split and (e.id, rel) in world.facts]
            n_pairs = int(comparisons_per_anchor * len(ents))
            seen = set()
            for _ in range(4 * n_pairs):
                if len(seen) >= n_pairs or len(ents) < 2:
                    break
                i, j = rng.choice(len(ents), size=2, replace=False)
                a, b = ents[i], ents[j]
                ya, yb = int(world.facts[(a.id, rel)].object), int(world.facts[(b.id, rel)].object)
                key = tuple(sorted((a.id, b.id)))
                if ya == yb or key in seen:
                    continue
                seen.add(key)
                hops = [_hop(world, a.id, rel, 1), _hop(world, b.id, rel, 2)]
                winner = a if ya < yb else b
                question = templates[int(rng.integers(len(templates)))].format(a=a.name, b=b.name)
                out.append(
                    _record(
                        f"syn-comparison-{rel}-{a.id}-{b.id}",
                        question,
                        winner.name,
                        hops,
                        "comparison",
                        split,
                        a.id,
                        a.heldout,
                        (rel, rel),
                    )
                )
    return out


def by_split(questions: list[dict]) -> dict[str, list[dict]]:
    out = {s: [] for s in SPLITS}
    for q in questions:
        out[q["split"]].append(q)
    return out
