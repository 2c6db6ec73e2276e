"""Conformance of jaxrag's ARENA reward with the authors' released code.

How the expected values were made: ren258/ARENA at commit 53f9569e1aff70b8bc307b2f7bdee6feee317cd8, file
src/evaluate.py, run unchanged outside this repository (it needs only the standard library):
`get_all_scores(text, golds, gold_ids)` for REWARD (its format_score, accuracy_score, relevance_score, bonus_score:
the four functions ARENA's GRPO trains with, src/grpo.py reward_funcs with configs/grpo.yaml weights 1, 1, 1, 1),
`normalize_answer(s)` for NORMALIZE and `f1_score(pred, [gold])` for F1 (Table 2's F1, Fig. 3's F1-accuracy). The
inputs were designed to cover each reading the rules leave open; the outputs are copied from that run as data.
Gold answer lists and gold ids are given as the released data gives them (ids sorted).
"""
import pytest

from jaxrag import metrics
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import ANSWER, Episode, Step
from jaxrag.supervision.rewards import get_reward

# (case, reply text, gold answers, gold supporting ids, format, accuracy, relevance, bonus) -- released outputs
REWARD = [
    ('clean', '<relevance>[1, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>Paris</answer>',
     ['Paris'], [1, 3], 1, 1, 1, 10),
    ('preamble', 'Sure! Here is my answer.\n<relevance>[1, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>Paris</answer>',
     ['Paris'], [1, 3], 0, 1, 1, 0),
    ('text_after_same_line', '<relevance>[1, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>Paris</answer> Hope this helps.',
     ['Paris'], [1, 3], 0, 1, 1, 0),
    ('text_after_next_line', '<relevance>[1, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>Paris</answer>\nHope this helps.',
     ['Paris'], [1, 3], 1, 1, 1, 10),
    ('lt_in_analysis', '<relevance>[1, 3]</relevance>\n<analysis>Ref 1: 3 < 4, so Paris.</analysis>\n<answer>Paris</answer>',
     ['Paris'], [1, 3], 0, 1, 1, 0),
    ('us_dots_vs_US', '<relevance>[1, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>U.S.</answer>',
     ['US'], [1, 3], 1, 0, 1, 0),
    ('curly_apostrophe', '<relevance>[1, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>Harry’s Bar</answer>',
     ["Harry's Bar"], [1, 3], 1, 1, 1, 10),
    ('underscore', '<relevance>[1, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>New_York</answer>',
     ['New York'], [1, 3], 1, 1, 1, 10),
    ('hyphen', '<relevance>[1, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>Jean-Paul Sartre</answer>',
     ['Jean Paul Sartre'], [1, 3], 1, 1, 1, 10),
    ('thousands_comma', '<relevance>[1, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>1,000</answer>',
     ['1000'], [1, 3], 1, 0, 1, 0),
    ('articles_punct', '<relevance>[1, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>The Eiffel Tower!</answer>',
     ['Eiffel Tower'], [1, 3], 1, 1, 1, 10),
    ('ids_without_brackets', '<relevance>1, 3</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>Paris</answer>',
     ['Paris'], [1, 3], 1, 1, 0, 0),
    ('empty_cited_empty_gold', '<relevance>[]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>Paris</answer>',
     ['Paris'], [], 1, 1, 1, 10),
    ('cited_vs_empty_gold', '<relevance>[1]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>Paris</answer>',
     ['Paris'], [], 1, 1, 0, 0),
    ('partial_overlap', '<relevance>[1, 2]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>Paris</answer>',
     ['Paris'], [1, 3], 1, 1, 0.5, 0),
    ('duplicate_unsorted_ids', '<relevance>[3, 1, 1]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>Paris</answer>',
     ['Paris'], [1, 3], 1, 1, 1, 10),
    ('float_ids', '<relevance>[1.0, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>Paris</answer>',
     ['Paris'], [1, 3], 1, 1, 1, 10),
    ('string_ids', '<relevance>["1", "3"]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>Paris</answer>',
     ['Paris'], [1, 3], 1, 1, 0, 0),
    ('relevance_newlines', '<relevance>\n[1, 3]\n</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>Paris</answer>',
     ['Paris'], [1, 3], 1, 1, 1, 10),
    ('two_answers_same_line', '<relevance>[1, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>Paris</answer> <answer>London</answer>',
     ['Paris'], [1, 3], 0, 1, 1, 0),
    ('two_answers_next_line_first_right', '<relevance>[1, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>Paris</answer>\n<answer>London</answer>',
     ['Paris'], [1, 3], 1, 1, 1, 10),
    ('two_answers_next_line_last_right', '<relevance>[1, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>London</answer>\n<answer>Paris</answer>',
     ['Paris'], [1, 3], 1, 0, 1, 0),
    ('unclosed_answer', '<relevance>[1, 3]</relevance>\n<analysis>x</analysis>\n<answer>Paris',
     ['Paris'], [1, 3], 0, 0, 1, 0),
    ('uppercase_tags', '<Relevance>[1, 3]</Relevance>\n<Analysis>x</Analysis>\n<Answer>Paris</Answer>',
     ['Paris'], [1, 3], 0, 0, 0, 0),
    ('no_relevance_section', '<analysis>x</analysis>\n<answer>Paris</answer>',
     ['Paris'], [1, 3], 0, 1, 0, 0),
    ('answer_padding', '<relevance>[1, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>  Paris \n</answer>',
     ['Paris'], [1, 3], 1, 1, 1, 10),
    ('multi_gold', '<relevance>[1, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>United States</answer>',
     ['US', 'United States'], [1, 3], 1, 1, 1, 10),
    ('no_gold_answers', '<relevance>[1, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>Paris</answer>',
     [], [1, 3], 1, 0, 1, 0),
    ('wrong_answer', '<relevance>[1, 3]</relevance>\n<analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis>\n<answer>London</answer>',
     ['Paris'], [1, 3], 1, 0, 1, 0),
    ('sections_no_whitespace', '<relevance>[1, 3]</relevance><analysis>Reference 1 says Paris is the capital; 3 confirms.</analysis><answer>Paris</answer>',
     ['Paris'], [1, 3], 1, 1, 1, 10),
    ('sections_other_text_between', '<relevance>[1, 3]</relevance> so <analysis>x</analysis>\n<answer>Paris</answer>',
     ['Paris'], [1, 3], 0, 1, 1, 0),
]

# (text, the released normalize_answer(text))
NORMALIZE = [
    ('U.S.', 'u s'),
    ('US', 'us'),
    ('Harry’s Bar', 'harry s bar'),
    ("Harry's Bar", 'harry s bar'),
    ('New_York', 'new york'),
    ('Jean-Paul', 'jean paul'),
    ('1,000', '1 000'),
    ('The Eiffel Tower!', 'eiffel tower'),
    ('an apple a day', 'apple day'),
    ('‘quoted’', 'quoted'),
    ('it´s', 'it s'),
    ('`tick`', 'tick'),
    ('A.B.C.', 'b c'),
    ('  spaced   out  ', 'spaced out'),
    ('Café', 'café'),
    ('x+y=z', 'x y z'),
    ('e.g., the best', 'e g best'),
    ('R&B', 'r b'),
    ('100%', '100'),
    ("Mother's day", 'mother s day'),
]

# (prediction, gold, the released f1_score(prediction, [gold]))
F1 = [
    ('yes', 'no', 0.0),
    ('no', 'no', 1.0),
    ('U.S. Army', 'US Army', 0.4),
    ('Jean-Paul Sartre', 'Sartre', 0.5),
    ('the cat sat', 'cat', 0.6666666666666666),
    ('New_York City', 'New York', 0.8),
]

ARENA = get_agent("arena")


def episode(text: str, golds, gold_ids) -> Episode:
    """The reply as the rollout engine records it: the agent's parse, the raw text, the gold ids in metadata."""
    action = ARENA.parse(text)
    return Episode("q", "question?", list(golds), agent="arena", steps=[Step(action)],
                   answer=action.text if action.kind == ANSWER else None,
                   done="answer" if action.kind == ANSWER else "invalid", metadata={"gold_ref_ids": list(gold_ids)})


@pytest.mark.parametrize("case,text,golds,gold_ids,fmt,acc,rel,bonus", REWARD, ids=[r[0] for r in REWARD])
def test_registered_arena_reward_is_the_released_one(case, text, golds, gold_ids, fmt, acc, rel, bonus):
    r = get_reward("arena")(episode(text, golds, gold_ids))
    assert r.components == {"format": fmt, "accuracy": acc, "relevance": rel, "bonus": bonus}
    assert r.total == pytest.approx(fmt + acc + rel + bonus)
    parts = metrics.arena_code_reward(text, golds, gold_ids)
    assert (parts["format"], parts["accuracy"], parts["relevance"], parts["bonus"]) == (fmt, acc, rel, bonus)


@pytest.mark.parametrize("text,expected", NORMALIZE)
def test_arena_normalize_is_the_released_one(text, expected):
    assert metrics.arena_normalize(text) == expected


@pytest.mark.parametrize("pred,gold,expected", F1)
def test_arena_f1_is_the_released_one(pred, gold, expected):
    assert metrics.arena_f1(pred, [gold]) == pytest.approx(expected)
    assert get_reward("arena_f1acc")(episode(
        f"<relevance>[1]</relevance><analysis>a</analysis><answer>{pred}</answer>", [gold], [1])
    ).components["accuracy"] == pytest.approx(expected)


def test_lenient_option_differs_where_the_issue_says():
    """The named option "arena_lenient" keeps jaxrag's first reading; the cases where it departs from the code."""
    lenient = get_reward("arena_lenient")
    by_name = {r[0]: r for r in REWARD}
    expect = {"preamble": 13.0, "us_dots_vs_US": 13.0, "curly_apostrophe": 2.0, "underscore": 2.0,
              "ids_without_brackets": 13.0, "empty_cited_empty_gold": 2.0,
              "two_answers_next_line_first_right": 2.0, "unclosed_answer": 2.0}
    for name, total in expect.items():
        _, text, golds, ids, *released = by_name[name]
        assert lenient(episode(text, golds, ids)).total == total, name
        assert sum(released) != total, name
