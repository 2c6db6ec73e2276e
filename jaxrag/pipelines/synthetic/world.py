"""Data stages of the synthetic pipeline (world, index, teacher, tokenizer) and the loaders later stages use."""

from __future__ import annotations

import collections
import dataclasses
import time
from pathlib import Path

import numpy as np

from jaxrag.data.synthetic import export, questions as Q, sft_data, teacher as T
from jaxrag.data.synthetic.world import generate_world
from jaxrag import tokenizer
from jaxrag.jsonl import read_jsonl
from jaxrag.console import num, summary
from jaxrag.data.synthetic.spm import train_sentencepiece
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import read_episodes, write_episodes
from jaxrag.env.rollout import RolloutConfig
from jaxrag.pipelines.common import load_checkpoint, log, model_dir, stage_dir, write_json
from jaxrag.pipelines.synthetic import checks
from jaxrag.retrieval import build_bm25, load_corpus
from jaxrag.sampling import JaxPolicy
from jaxrag.train.distributed import lead_only


# ------------------------------------------------------------------------------------------------ loaders
def load_questions(workdir, split: str) -> list[dict]:
    path = export.question_paths(Path(workdir) / "world")[split]
    rows = read_jsonl(path)
    if not rows:
        raise ValueError(f"{path}: empty (no {split} questions; is the world too small for its split fractions?)")
    return rows


def train_subset(workdir, n: int, seed: int, offset: int = 0) -> list[dict]:
    """A seeded subset of the train questions (the same for every stage that asks with the same seed/offset)."""
    qs = load_questions(workdir, "train")
    order = np.random.default_rng(seed).permutation(len(qs))
    return [qs[i] for i in order[offset:offset + n]] if n else [qs[i] for i in order]


def unseen_pool(config, workdir) -> list[dict]:
    """The train questions kept out of SFT: the first `config.unseen_questions` of the seeded train order. Every later
    stage that samples from a trained policy on train questions (supervision, outcome, GRPO, MCTS, SmartSearch) draws
    from them (`sampling_questions`), so its process rewards, rejection sampling and RL see questions the policy was
    not fine-tuned on, as RAG-Gym collects on questions its actor was not tuned on. [] when unseen_questions is 0
    (then they sample questions SFT trained on, whose answers a small policy has partly memorized).
    config.unseen_by_anchor (opt-in): whole anchors instead, every train question of an anchor entity kept out with it
    (anchors in seeded order until at least unseen_questions questions; the pool then in seeded order): with question
    -level pools, nearly every pool question's anchor also anchors questions SFT trains on (1,156 of 1,183 in the
    demo), so the policy has learned the pool's first-hop facts; dev is split by anchor for that reason."""
    n = int(config.get("unseen_questions", 0))
    if not n:
        return []
    if not config.get("unseen_by_anchor", False):
        return train_subset(workdir, n, config.seed)
    by_anchor: dict[str, list[dict]] = {}
    for q in load_questions(workdir, "train"):
        by_anchor.setdefault(q["metadata"]["anchor"], []).append(q)
    anchors = sorted(by_anchor)
    pool: list[dict] = []
    for i in np.random.default_rng(config.seed).permutation(len(anchors)):
        if len(pool) >= n:
            break
        pool += by_anchor[anchors[i]]
    return [pool[i] for i in np.random.default_rng(config.seed + 1).permutation(len(pool))]


def sampling_questions(config, workdir, n: int) -> list[dict]:
    """The train questions a sampling stage draws: the first n of the unseen pool (for a question-level pool, the
    same as train_subset(n)), or of the seeded train order when there is no pool (n = 0: all of them)."""
    pool = unseen_pool(config, workdir)
    if not pool:
        return train_subset(workdir, n, config.seed)
    if n > len(pool):
        raise ValueError(f"{n} questions asked of an unseen pool of {len(pool)}: raise unseen_questions")
    return pool[:n] if n else pool


def corpus_path(workdir) -> Path:
    return Path(workdir) / "world" / "corpus.jsonl"


def make_retriever(config, workdir, out_dir: str | None = None):
    """BM25 over the world's corpus, built in-process (sub-second for the synthetic corpus)."""
    return build_bm25(load_corpus(corpus_path(workdir)), backend=config.index.backend, out_dir=out_dir)


def stage_policy(workdir, stage: str, tok, shapes=None):
    """A JaxPolicy over the model that stage `stage` trained (workdir/<stage>/model), with the world's tokenizer.
    shapes: the config's optional `sampler` section (min_rows, min_prompt: the sampler's shape floors, which the
    tiny preset sets so its stages share a few compiled programs; absent = the sampler's own buckets)."""
    mcfg, params = load_checkpoint(model_dir(workdir, stage))
    return JaxPolicy(mcfg, params, tok, **dict(shapes or {}))   # keys checked before any stage: checks.SAMPLER_KEYS


def load_teacher_episodes(workdir, split: str):
    return read_episodes(Path(workdir) / "teacher" / f"episodes_{split}.jsonl")


def tokenizer_path(workdir) -> Path:
    return Path(workdir) / "tokenizer" / "spm.model"


def load_tokenizer(workdir):
    return tokenizer.load_tokenizer(tokenizer_path(workdir))


# ------------------------------------------------------------------------------------------------ stages
def world_seed(config) -> int:
    """The seed of the world, its questions and the teacher's episodes: config.world_seed, so a seeds study varies
    `seed` (SFT init and data order, sampling) over one fixed world; configs without the key use `seed`."""
    return int(config.get("world_seed", config.seed))


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def world_stage(config, workdir, name) -> None:
    s = config[name]
    w = generate_world(
        world_seed(config), s.n_countries, s.n_cities, s.n_persons, s.n_films, s.n_companies, s.heldout_frac
    )
    qs = Q.generate_questions(w, tuple(s.split_fractions), s.comparisons_per_anchor, world_seed(config))
    paths = export.export_world(w, qs, str(Path(workdir) / "world"))
    counts = collections.Counter(f"{q['split']}/{q['metadata']['type']}" for q in qs)
    stats = {"passages": len(w.passages), "entities": len(w.entities), "questions": dict(sorted(counts.items())),
             "paths": paths}
    write_json(stage_dir(workdir, name) / "stats.json", stats)
    by_split = collections.Counter(q["split"] for q in qs)
    log(name, f"{len(w.passages)} passages, {len(qs)} questions ({summary(dict(sorted(by_split.items())))})")


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def index_stage(config, workdir, name) -> None:
    retriever = make_retriever(config, workdir, out_dir=str(stage_dir(workdir, name) / "bm25"))
    # Diagnostic: does the first good teacher query of each hop find its gold passage at k?
    hops = [h for q in load_questions(workdir, "dev") for h in q["metadata"]["gold_chain"]]
    queries = [T.QUERY_TEMPLATES[h["relation"]][0].format(e=h["entity"]) for h in hops]
    k = config.index.k
    found = [h["passage_id"] in {x.doc_id for x in hits} for h, hits in zip(hops, retriever.search(queries, k))]
    stats = {"backend": config.index.backend, "k": k, "dev_hops": len(hops),
             "gold_recall_at_k_first_template": float(np.mean(found)) if found else 0.0}
    write_json(stage_dir(workdir, name) / "stats.json", stats)
    log(name, f"{stats['backend']}, k {k}: gold recall {num(stats['gold_recall_at_k_first_template'])} over "
              f"{len(hops)} dev hops (each hop's first query template)")


def rollout_config(config, s, **over):
    """The rollout engine's settings for a sampling or eval section `s`: the index's k, the section's max_steps,
    batch_size and max_new_tokens, EM reward, the run's seed; `over` replaces any of them (temperature, seed, ...)."""
    base = dict(k=config.index.k, max_steps=s.max_steps, batch_size=s.batch_size, max_new_tokens=s.max_new_tokens,
                reward="em", seed=config.seed)
    return RolloutConfig(**{**base, **over})


def teacher_config(section) -> T.TeacherConfig:
    """The teacher's settings from its config section (a TeacherConfig field the section lacks keeps its default)."""
    return T.TeacherConfig(**{f.name: section[f.name] for f in dataclasses.fields(T.TeacherConfig) if f.name in section})


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def teacher_stage(config, workdir, name) -> None:
    s = config[name]
    retriever = make_retriever(config, workdir)
    passages = {p.doc_id: p for p in load_corpus(corpus_path(workdir))}
    entities = read_jsonl(Path(workdir) / "world" / "entities.jsonl")
    pool = T.guess_pool_from_entities([e for e in entities if not e["heldout"]])
    cfg = teacher_config(s)
    stats = {}
    out = stage_dir(workdir, name)
    for split in s.splits:
        qs = load_questions(workdir, split)
        t0 = time.perf_counter()
        trajs = T.run_teacher(qs, retriever, config.index.k, cfg, seed=world_seed(config), guess_pool=pool)
        eps = [sft_data.teacher_episode(q, st, passages) for q, st in zip(qs, trajs)]
        write_episodes(out / f"episodes_{split}.jsonl", eps)
        flaws = collections.Counter(str(f) for e in eps for f in e.metadata["flaws"])
        stats[split] = {
            "episodes": len(eps),
            "em": float(np.mean([e.reward for e in eps])) if eps else 0.0,
            "mean_searches": float(np.mean([e.num_searches for e in eps])) if eps else 0.0,
            "actions": dict(flaws),
            "seconds": round(time.perf_counter() - t0, 2),
        }
        log(name, f"{split}: " + summary(stats[split], ("episodes", "em", "mean_searches", "seconds")))
    write_json(out / "stats.json", stats)


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def tokenizer_stage(config, workdir, name) -> None:
    """sentencepiece on the non-held-out passages, the train questions and the train SFT texts of every agent
    named in config[name].agents (the formats the policies will be trained in)."""
    s = config[name]
    metas = read_jsonl(Path(workdir) / "world" / "passages_meta.jsonl")
    entities = {e["id"]: e for e in read_jsonl(Path(workdir) / "world" / "entities.jsonl")}
    texts = [f"{m['title']}: {m['contents']}" for m in metas if not entities[m["subject"]]["heldout"]]
    episodes = load_teacher_episodes(workdir, "train")
    for agent_name in s.agents:
        agent = get_agent(agent_name, mode="plain")
        for ep in episodes:
            pairs = sft_data.step_pairs(ep, agent)
            texts.append(pairs[-1][0] + pairs[-1][1])
    path = train_sentencepiece(texts, str(tokenizer_path(workdir)), s.vocab_size)
    log(name, f"{path} from {len(texts)} texts")


# jaxrag.main checks the config before any stage runs
world_stage.check_config = checks.check_stage
index_stage.check_config = checks.check_stage
teacher_stage.check_config = checks.check_stage
tokenizer_stage.check_config = checks.check_stage
