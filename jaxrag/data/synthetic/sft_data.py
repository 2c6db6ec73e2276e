"""Teacher trajectories -> Episodes (JSONL) -> SFT sequences in an agent's own format.

A trajectory's steps become (prompt, target) pairs with prompt = agent.render(state before the step) and target =
agent.format(action) + the agent's stop string, so the SFT data is exactly what the agent parses at eval time.
When each next prompt extends the previous prompt + target (line-based "plain" agents), the whole trajectory is
packed into one sequence with the loss on every action segment; otherwise each step is its own sequence.
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np

from jaxrag.data.synthetic.teacher import TeacherStep
from jaxrag.env.mdp import ANSWER, Action, Doc, Episode, State, Step
from jaxrag.metrics import exact_match


def teacher_episode(question: dict, steps: list[TeacherStep], passages: dict) -> Episode:
    """One teacher trajectory as an Episode (docs filled by id from the corpus passages: .title, .text)."""
    ep_steps = []
    for s in steps:
        docs = [Doc(d, 0.0, passages[d].title, passages[d].text) for d in s.doc_ids]
        ep_steps.append(Step(Action(s.action.kind, s.action.text, "", dict(s.action.extra)), docs=docs))
    answer = steps[-1].action.text if steps and steps[-1].action.kind == ANSWER else None
    reward = exact_match(answer, question["golden_answers"])
    meta = {k: question["metadata"][k] for k in ("type", "hops")}
    meta["split"] = question["split"]
    meta["flaws"] = [s.action.extra.get("flaw") for s in steps]
    return Episode(
        question["id"],
        question["question"],
        list(question["golden_answers"]),
        agent="teacher",
        steps=ep_steps,
        answer=answer,
        reward=reward,
        ret=reward,
        done="answer",
        metadata=meta,
    )


def step_pairs(episode: Episode, agent) -> list[tuple[str, str]]:
    """(prompt, target) for every step of the episode, rendered by `agent`."""
    stop = agent.stop[0] if agent.stop else ""
    out = []
    for t, step in enumerate(episode.steps):
        state = State(episode.question, list(episode.steps[:t]), qid=episode.qid)
        out.append((agent.render(state), agent.format(step.action) + stop))
    return out


@dataclasses.dataclass
class Sequence_:
    tokens: list[int]
    loss_mask: list[int]
    qid: str


def pack_episode(episode: Episode, agent, tokenizer, add_bos: bool = True) -> list[Sequence_]:
    """Token sequences with loss on action tokens. Segments are tokenized separately, as generation sees them."""
    pairs = step_pairs(episode, agent)
    seqs: list[Sequence_] = []
    text = ""  # the text the current sequence covers
    for prompt, target in pairs:
        if seqs and prompt.startswith(text):
            extra = prompt[len(text) :]
            cur = seqs[-1]
        else:
            extra = prompt
            cur = Sequence_([tokenizer.bos_id] if add_bos and tokenizer.bos_id is not None else [], [], episode.qid)
            cur.loss_mask = [0] * len(cur.tokens)
            seqs.append(cur)
            text = ""
        ctx = tokenizer.encode(extra) if extra else []
        act = tokenizer.encode(target)
        cur.tokens += ctx + act
        cur.loss_mask += [0] * len(ctx) + [1] * len(act)
        text = (text if extra is not prompt else "") + extra + target
    return seqs


def to_arrays(seqs: list[Sequence_], length: int, pad_id: int) -> dict[str, np.ndarray]:
    """Right-padded [N, length] tokens / loss_mask / segment_ids (0 = padding). Longer sequences must be dropped
    before (see `fit_length`)."""
    n = len(seqs)
    tokens = np.full((n, length), pad_id, np.int32)
    mask = np.zeros((n, length), np.float32)
    seg = np.zeros((n, length), np.int32)
    for i, s in enumerate(seqs):
        if len(s.tokens) > length:
            raise ValueError(f"sequence of question {s.qid} has {len(s.tokens)} tokens > {length}")
        tokens[i, : len(s.tokens)] = s.tokens
        mask[i, : len(s.tokens)] = s.loss_mask
        seg[i, : len(s.tokens)] = 1
    return {"tokens": tokens, "loss_mask": mask, "segment_ids": seg}


def pack_rows(seqs: list[Sequence_], length: int, pad_id: int) -> dict[str, np.ndarray]:
    """Pack sequences into [R, length] rows (worst-fit decreasing): segment_ids 1, 2, ... per row (0 = padding),
    positions restart at 0 in every segment, so the model sees each sequence exactly as if it were alone."""
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i].tokens))
    rows: list[list[int]] = []
    room: list[tuple[int, int]] = []  # max-heap of (-free slots, row)
    for i in order:
        n = len(seqs[i].tokens)
        if n > length:
            raise ValueError(f"sequence of question {seqs[i].qid} has {n} tokens > {length}")
        if room and -room[0][0] >= n:
            free, r = heapq.heappop(room)
            rows[r].append(i)
            heapq.heappush(room, (free + n, r))
        else:
            rows.append([i])
            heapq.heappush(room, (-(length - n), len(rows) - 1))
    out = {
        "tokens": np.full((len(rows), length), pad_id, np.int32),
        "loss_mask": np.zeros((len(rows), length), np.float32),
        "segment_ids": np.zeros((len(rows), length), np.int32),
        "positions": np.zeros((len(rows), length), np.int32),
    }
    for r, members in enumerate(rows):
        at = 0
        for seg, i in enumerate(members, start=1):
            s = seqs[i]
            n = len(s.tokens)
            out["tokens"][r, at : at + n] = s.tokens
            out["loss_mask"][r, at : at + n] = s.loss_mask
            out["segment_ids"][r, at : at + n] = seg
            out["positions"][r, at : at + n] = np.arange(n)
            at += n
    return out


def fit_length(seqs: list[Sequence_], max_len: int) -> tuple[list[Sequence_], int]:
    """Sequences that fit in max_len, and how many were dropped."""
    kept = [s for s in seqs if len(s.tokens) <= max_len]
    return kept, len(seqs) - len(kept)
