"""RAG-Gym critic training data (collect.critic_pairs): a collection's states re-rendered in the critic's own chat
template and tokenized with the critic's tokenizer, RAG-Gym's pair rule, the max_len drop; the train stage's epochs."""

import ml_collections
import pytest

from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import Action, Doc, Step
from jaxrag.testing import ByteTokenizer
from jaxrag.pipelines.collect import critic_pairs
from jaxrag.pipelines.train import check_config, epoch_steps
from jaxrag.supervision.records import ProcessRecord, ScoredCandidate


class UpperTokenizer(ByteTokenizer):
    """Another 'family': its chat template differs from the policy's (a marker line per message)."""

    def chat(self, messages, add_generation_prompt=True):
        return "".join(f"<<{m['role']}>>\n{m['content']}\n" for m in messages) + ("<<assistant>>\n" if add_generation_prompt else "")


def record() -> ProcessRecord:
    hist = [Step(action=Action("query", "who wrote it", "search: who wrote it"),
                 docs=[Doc("d1", 1.0, "Book", "Written by Ann.")])]
    cands = [ScoredCandidate("answer: Ann", Action("answer", "Ann", "answer: Ann"), score=1.0, rank=0),
             ScoredCandidate("answer: Bob", Action("answer", "Bob", "answer: Bob"), score=1 / 3, rank=2),
             ScoredCandidate("search: " + "x" * 300, Action("query", "x" * 300, ""), score=0.25, rank=3),
             ScoredCandidate("answer: Ann?", Action("answer", "Ann?", ""), score=0.5, rank=1)]
    return ProcessRecord(qid="q1", question="Who wrote the book?", gold=["Ann"], agent="react", history=hist,
                         prompt="<the policy's own rendering>", candidates=cands, source="rank:gpt-4o", step=1)


def test_pairs_are_rerendered_and_tokenized_for_the_critic():
    tok = UpperTokenizer()
    agent = get_agent("react", tokenizer=tok, max_doc_chars=None)
    rows, dropped = critic_pairs([record()], agent, tok, max_len=4096)
    prompt = agent.render(record().state())
    assert prompt.startswith("<<system>>") and "Written by Ann." in prompt      # the critic's template, not the record's
    # RAG-Gym's rule: score > 0.75 vs < 0.5 (0.5 itself is neither): Ann vs Bob, Ann vs the long search
    assert [(r["chosen_ids"], r["rejected_ids"]) for r in rows] == [
        (tok.encode("answer: Ann"), tok.encode("answer: Bob")), (tok.encode("answer: Ann"), tok.encode("search: " + "x" * 300))]
    assert all(r["prompt_ids"] == tok.encode(prompt, add_bos=True) for r in rows) and dropped == 0
    assert rows[0]["qid"] == "q1" and rows[0]["step"] == 1


def test_pairs_over_max_len_are_dropped_as_the_released_code_does():
    tok = UpperTokenizer()
    agent = get_agent("react", tokenizer=tok, max_doc_chars=None)
    full = len(critic_pairs([record()], agent, tok, max_len=4096)[0][0]["prompt_ids"])
    rows, dropped = critic_pairs([record()], agent, tok, max_len=full + 20)   # the 308-byte search no longer fits
    assert dropped >= 1 and all(len(r["prompt_ids"]) + len(r["rejected_ids"]) <= full + 20 for r in rows)


def test_epoch_steps_and_the_epochs_key():
    assert epoch_steps(1, 100, 32) == 4 and epoch_steps(3, 64, 64) == 3 and epoch_steps(0.5, 10, 4) == 2
    c = ml_collections.ConfigDict({"s": {"data": "x.jsonl", "init": "/m", "train": {}, "epochs": -1}})
    with pytest.raises(ValueError, match=r"config.s.epochs: -1: a number >= 0"):
        check_config(c, "s")
