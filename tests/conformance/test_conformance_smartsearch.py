"""Conformance of jaxrag's SmartSearch reward with the authors' released code.

How the expected values were made: RUC-NLPIR/SmartSearch at commit 5e9e7ec0d6af34f45fad145d4bff442529e7e6ff, file
src/verl/utils/reward_score/re_call.py, run unchanged outside this repository: `compute_score_with_format(None,
prompt + response, gold)` (the reward verl's re_call reward manager gives every GRPO trajectory), the response
rendered from each case's segments as below (a search's result block holds its documents "(i) doc text i" separated
by blank lines, as the code's redundancy check splits them), the prompt a chat transcript whose system message holds
three "<think>" and whose assistant turn starts after a fourth (the released template appends one), and the
process-reward model's HTTP call (get_model_score) replaced by the case's scripted replies, one per search round.
The boxed column is `remove_boxed(last_boxed_only_string(response))` ("" where it raises). Outputs copied from that
run as data, rounded to 10 digits.

jaxrag's side runs the pipeline a GRPO step runs: the SmartSearch agent parses each generation, the searches carry
Docs with ids 1..n, `assess` asks a judge (here one that answers each request with "<answer> reply </answer>",
read by jaxrag's parser), then the registered reward "smartsearch" scores the episode.
"""
import pytest

from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import ANSWER, Doc, Episode, Step
from jaxrag.supervision import smartsearch as SS
from jaxrag.supervision.judge_protocol import JudgeResult
from jaxrag.supervision.prompts import parse_usefulness
from jaxrag.supervision.rewards import get_reward

# (case, segments, PRM replies per search round, gold answers, released reward, released boxed answer).
# A segment: ("S", query, doc ids, think): a search, its result appended by the environment;
# ("A", answer text, think, text before it): the answering generation; ("R", text): one generation as written.
CASES = [
    ('one_good_search_correct', [('S', 'q1', [1, 2], 'I need to look this up.'), ('A', 'The final answer is \\boxed{Paris}', 'I know it now.', '')],
     ['1'], ['Paris'], 1.1, 'Paris'),
    ('no_search_correct', [('A', 'The final answer is \\boxed{Paris}', 'I know it now.', '')],
     [], ['Paris'], 1.1, 'Paris'),
    ('unboxed_correct_no_search', [('A', 'Paris', 'I know it now.', '')],
     [], ['Paris'], 0.0, ''),
    ('unboxed_correct_3_good', [('S', 'a', [1], 'look'), ('S', 'b', [2], 'look'), ('S', 'c', [3], 'look'), ('A', 'Paris', 'done', '')],
     ['1', '1', '1'], ['Paris'], 0.3, ''),
    ('boxed_in_think_plain_wrong', [('S', 'a', [1], 'look'), ('A', 'London', 'Maybe \\boxed{Paris}.', '')],
     ['1'], ['Paris'], 1.0, 'Paris'),
    ('correct_1_wrong', [('S', 'a', [1], 'look'), ('S', 'b', [2], 'look'), ('A', '\\boxed{Paris}', 'done', '')],
     ['1', '0'], ['Paris'], 1.0, 'Paris'),
    ('correct_4_wrong', [('S', 'q0', [0], 'look'), ('S', 'q1', [1], 'look'), ('S', 'q2', [2], 'look'), ('S', 'q3', [3], 'look'), ('A', '\\boxed{Paris}', 'done', '')],
     ['0', '0', '0', '0'], ['Paris'], 0.8, 'Paris'),
    ('wrong_2_good', [('S', 'a', [1], 'look'), ('S', 'b', [2], 'look'), ('A', '\\boxed{London}', 'done', '')],
     ['1', '1'], ['Paris'], 0.3, 'London'),
    ('wrong_5_good', [('S', 'q0', [0], 'look'), ('S', 'q1', [1], 'look'), ('S', 'q2', [2], 'look'), ('S', 'q3', [3], 'look'), ('S', 'q4', [4], 'look'), ('A', '\\boxed{London}', 'done', '')],
     ['1', '1', '1', '1', '1'], ['Paris'], 0.4, 'London'),
    ('redundant_2_docs', [('S', 'a', [1, 2, 3], 'look'), ('S', 'b', [1, 2, 4], 'look'), ('A', '\\boxed{Paris}', 'done', '')],
     ['1', '1'], ['Paris'], 1.0, 'Paris'),
    ('redundant_1_doc', [('S', 'a', [1, 2, 3], 'look'), ('S', 'b', [1, 4], 'look'), ('A', '\\boxed{Paris}', 'done', '')],
     ['1', '1'], ['Paris'], 1.1, 'Paris'),
    ('wrong_judge0_and_redundant', [('S', 'a', [1, 2], 'look'), ('S', 'b', [1, 2], 'look'), ('A', '\\boxed{London}', 'done', '')],
     ['1', '0'], ['Paris'], 0.2, 'London'),
    ('bad_search_tag', [('S', 'a', [1], 'look'), ('A', '\\boxed{Paris}', 'done', '<search> x </search<')],
     ['1'], ['Paris'], 0.0, 'Paris'),
    ('two_answer_blocks', [('R', '<think> a </think>\n<answer> \\boxed{London} </answer><think> b </think>\n<answer> \\boxed{Paris} </answer>')],
     [], ['Paris'], 1.0, 'Paris'),
    ('f1_exactly_0.8', [('A', '\\boxed{Eiffel Tower}', 'done', '')],
     [], ['Eiffel Tower Paris'], 1.1, 'Eiffel Tower'),
    ('f1_below_0.8', [('A', '\\boxed{the tower}', 'done', '')],
     [], ['Eiffel Tower'], 0.1, 'the tower'),
    ('yes_vs_no', [('A', '\\boxed{no}', 'done', '')],
     [], ['yes'], 0.1, 'no'),
    ('boxed_space_variant', [('A', '\\boxed Paris', 'done', '')],
     [], ['Paris'], 0.0, 'Paris </answer>'),
    ('boxed_text_wrapper', [('A', '\\boxed{\\text{Paris}}', 'done', '')],
     [], ['Paris'], 0.1, '\\text{Paris}'),
    ('boxed_unclosed', [('A', '\\boxed{Paris', 'done', '')],
     [], ['Paris'], 0.0, ''),
    ('fbox', [('A', '\\fbox{Paris}', 'done', '')],
     [], ['Paris'], 0.0, ''),
    ('two_boxed_last_wins', [('A', '\\boxed{London} or rather \\boxed{Paris}', 'done', '')],
     [], ['Paris'], 1.1, 'Paris'),
    ('boxed_nested_braces', [('A', '\\boxed{{Paris}}', 'done', '')],
     [], ['Paris'], 1.1, '{Paris}'),
    ('judge_reply_empty_counts_good', [('S', 'a', [1], 'look'), ('A', '\\boxed{London}', 'done', '')],
     [''], ['Paris'], 0.2, 'London'),
    ('judge_reply_not_a_number_counts_good', [('S', 'a', [1], 'look'), ('A', '\\boxed{London}', 'done', '')],
     ['yes'], ['Paris'], 0.2, 'London'),
    ('multi_gold', [('A', '\\boxed{USA}', 'done', '')],
     [], ['United States', 'USA'], 1.1, 'USA'),
    ('search_without_result_then_answer', [('R', '<think> t </think>\n<search> q </search>\n<think> done </think>\n<answer> \\boxed{Paris} </answer>')],
     [], ['Paris'], 1.0, 'Paris'),
    ('correct_redundant_and_judged_0_same_step', [('S', 'a', [1, 2], 'look'), ('S', 'b', [1, 2], 'look'), ('A', '\\boxed{Paris}', 'done', '')],
     ['1', '0'], ['Paris'], 1.0, 'Paris'),
]

# A difference kept on purpose: the released code counts a query as bad only when the PRM's reply is the string "0",
# so "0.0" counts as good (0.2 below); jaxrag reads the reply as the number 0 (one more bad query: 0.1).
KNOWN_FIX = [
    ('judge_reply_0.0', [('S', 'a', [1], 'look'), ('A', '\\boxed{London}', 'done', '')],
     ['0.0'], ['Paris'], 0.2, 'London'),
]
KNOWN_FIX_JAXRAG = {"judge_reply_0.0": 0.1}

AGENT = get_agent("smartsearch")


def step_raw(seg) -> str:
    if seg[0] == "S":
        return f"<think> {seg[3]} </think>\n<search> {seg[1]} </search>"
    if seg[0] == "A":
        return f"{seg[3]}<think> {seg[2]} </think>\n<answer> {seg[1]} </answer>"
    return seg[1]


def episode(segments, gold) -> Episode:
    steps = []
    for seg in segments:
        action = AGENT.parse(step_raw(seg))
        docs = [Doc(str(i), title=f"t{i}", text=f"doc text {i}") for i in seg[2]] if seg[0] == "S" else []
        steps.append(Step(action, docs=docs))
    last = steps[-1].action
    return Episode("q", "Q?", list(gold), agent="smartsearch", steps=steps,
                   answer=last.text if last.kind == ANSWER else None, done="answer" if last.kind == ANSWER else "invalid")


class ScriptedPRM:
    """A usefulness judge answering each request, in order, with "<answer> reply </answer>"."""

    def __init__(self, replies):
        self.replies = list(replies)

    def judge(self, requests):
        out = []
        for _ in requests:
            p = parse_usefulness(f"<answer> {self.replies.pop(0)} </answer>")
            out.append(JudgeResult(p.scores, failure=p.failure, rationale=p.rationale))
        return out


def scored(segments, replies, gold) -> float:
    ep = episode(segments, gold)
    prm = ScriptedPRM(replies)
    SS.assess([ep], prm)
    assert not prm.replies   # one request per search round, as the released reward asks
    return get_reward("smartsearch")(ep).total


@pytest.mark.parametrize("case,segments,replies,gold,released,boxed", CASES, ids=[c[0] for c in CASES])
def test_registered_smartsearch_reward_is_the_released_one(case, segments, replies, gold, released, boxed):
    assert scored(segments, replies, gold) == pytest.approx(released, abs=1e-9)
    assert SS.code_boxed_answer(SS.transcript(episode(segments, gold))) == boxed


@pytest.mark.parametrize("case,segments,replies,gold,released,boxed", KNOWN_FIX, ids=[c[0] for c in KNOWN_FIX])
def test_kept_fix_differs_from_the_released_code_as_documented(case, segments, replies, gold, released, boxed):
    assert scored(segments, replies, gold) == pytest.approx(KNOWN_FIX_JAXRAG[case])
    assert released != pytest.approx(KNOWN_FIX_JAXRAG[case])


def test_parsed_option_scores_the_agents_answer():
    """The named option "smartsearch_parsed" reads the agent's answer (an unboxed <answer> counts)."""
    by = {c[0]: c for c in CASES}
    for case, expect in (("unboxed_correct_no_search", 1.0), ("boxed_in_think_plain_wrong", 0.1)):
        _, segs, replies, gold, released, _ = by[case]
        ep = episode(segs, gold)
        SS.assess([ep], ScriptedPRM(replies))
        assert get_reward("smartsearch_parsed")(ep).total == pytest.approx(expect)
        assert released != pytest.approx(expect)
