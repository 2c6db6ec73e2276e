"""Conformance of SmartSearch's evaluation answer (Table 1, Table 3's rows) with the authors' released evaluation.

How the expected values were made: RUC-NLPIR/SmartSearch at commit 5e9e7ec0d6af34f45fad145d4bff442529e7e6ff, file
src/flashrag/pipeline/active_pipeline.py, `ReCallPipeline.run_item` run unchanged outside this repository (its
`extract_last_assistant_response`, then `remove_boxed(last_boxed_only_string(.))` of
src/verl/utils/reward_score/re_call.py, an exception read as ""), the prediction `item.output["pred"]` recorded. The
modules it imports but these functions do not use (flashrag's retriever/generator/dataset helpers, verl's
templates, transformers, tqdm) were stubbed, and `ReCall.run` was replaced by a function returning the case's
response: mode "gen" the generated text alone (a search case with its result block); mode "prompt"
`ReCall.init_prompt(question)` (the released system prompt, whose example reads `<answer> The final answer is
\\[ \\boxed{answer here} \\] </answer>`) followed by the generated text, which is what `ReCall.run` returns. Command:
`python run_released_eval.py cases.json released.json` in a scratch directory holding the three released files.
Outputs copied from that run as data.

jaxrag's side: the SmartSearch agent (default eval_answer "boxed") parses each generation into an episode step, and
`agent.scored_answer(episode)` is the answer jaxrag.evaluate.episode_metrics scores (EM, F1, SE).
"""
import pytest

from jaxrag import metrics as M
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import ANSWER, QUERY, Doc, Episode, Step
from jaxrag.evaluate import episode_metrics

# (case, mode, the episode's generations in order, the released prediction)
CASES = [
    ('boxed', 'gen', ['<think> I know it. </think>\n<answer> The final answer is \\boxed{Paris} </answer>'], 'Paris'),
    ('boxed_latex_display', 'gen', ['<think> t </think>\n<answer> The final answer is \\[ \\boxed{Paris} \\] </answer>'], 'Paris'),
    ('unboxed', 'gen', ['<think> t </think>\n<answer> Paris </answer>'], ''),
    ('unboxed_final_answer_is', 'gen', ['<think> t </think>\n<answer> The final answer is Paris </answer>'], ''),
    ('boxed_in_think_unboxed_answer', 'gen', ['<think> maybe \\boxed{Rome} </think>\n<answer> Paris </answer>'], ''),
    ('boxed_after_answer', 'gen', ['<think> t </think>\n<answer> \\boxed{Paris} </answer> so \\boxed{Rome}'], 'Paris'),
    ('two_answers_last_boxed', 'gen', ['<answer> \\boxed{London} </answer> <answer> \\boxed{Paris} </answer>'], 'Paris'),
    ('two_answers_last_unboxed', 'gen', ['<answer> \\boxed{Paris} </answer> <answer> Paris </answer>'], ''),
    ('two_boxes_in_answer', 'gen', ['<answer> either \\boxed{London} or \\boxed{Paris} </answer>'], 'Paris'),
    ('text_inside_box', 'gen', ['<answer> \\boxed{\\text{Paris}} </answer>'], '\\text{Paris}'),
    ('double_braces', 'gen', ['<answer> \\boxed{{Paris}} </answer>'], '{Paris}'),
    ('boxed_space', 'gen', ['<answer> The final answer is \\boxed Paris </answer>'], 'Paris'),
    ('boxed_space_dollar', 'gen', ['<answer> $\\boxed Paris$ indeed </answer>'], 'Paris'),
    ('boxed_space_beats_braces', 'gen', ['<answer> \\boxed{London} then \\boxed Paris </answer>'], 'Paris'),
    ('unclosed_box', 'gen', ['<answer> \\boxed{Paris </answer>'], ''),
    ('fbox', 'gen', ['<answer> \\fbox{Paris} </answer>'], ''),
    ('empty_box', 'gen', ['<answer> \\boxed{} </answer>'], ''),
    ('box_with_spaces', 'gen', ['<answer>\\boxed{ New  York }</answer>'], ' New  York '),
    ('box_then_text', 'gen', ['<answer> \\boxed{Paris}, France </answer>'], 'Paris'),
    ('multiline_answer', 'gen', ['<think> t </think>\n<answer>\nThe answer is\n\\boxed{New York}\n</answer>'], 'New York'),
    ('unclosed_answer', 'gen', ['<think> t </think>\n<answer> \\boxed{Paris}'], ''),
    ('uppercase_tags', 'gen', ['<ANSWER> \\boxed{Paris} </ANSWER>'], ''),
    ('empty_answer', 'gen', ['<think> t </think>\n<answer> </answer>'], ''),
    ('no_answer_tags_boxed', 'gen', ['<think> t </think> The final answer is \\boxed{Paris}'], ''),
    ('search_then_answer', 'gen', ['<think> look </think>\n<search> capital of France </search>', '\n<think> ok </think>\n<answer> \\boxed{Paris} </answer>'], 'Paris'),
    ('prompt_no_answer', 'prompt', ['<think> I cannot tell. </think>'], 'answer here'),
    ('prompt_unclosed_answer', 'prompt', ['<think> t </think>\n<answer> \\boxed{Paris}'], 'answer here'),
    ('prompt_boxed', 'prompt', [' t </think>\n<answer> \\boxed{Paris} </answer>'], 'Paris'),
]
# The released reading of these falls back to the system prompt's own example, which jaxrag never reads (it reads
# the model's generations only): a trajectory without a closed <answer> scores no answer (a fix, kept; the example's
# "answer here" scores 0 against nearly every gold answer).
PROMPT_EXAMPLE = {"prompt_no_answer", "prompt_unclosed_answer"}
AGENT = get_agent("smartsearch")


def episode(gens, gold=("Paris",)) -> Episode:
    steps = []
    for g in gens:
        action = AGENT.parse(g)
        steps.append(Step(action, docs=[Doc("1", title="France", text="Paris is its capital.")]
                          if action.kind == QUERY else []))
    last = steps[-1].action
    return Episode("q", "Q?", list(gold), agent="smartsearch", steps=steps,
                   answer=last.text if last.kind == ANSWER else None, done="answer" if last.kind == ANSWER else "invalid")


def test_table_size():
    assert len(CASES) >= 15 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case,mode,gens,released", CASES, ids=[c[0] for c in CASES])
def test_scored_answer_is_the_released_prediction(case, mode, gens, released):
    expected = "" if case in PROMPT_EXAMPLE else released
    assert AGENT.scored_answer(episode(gens)) == expected


@pytest.mark.parametrize("case,mode,gens,released", CASES, ids=[c[0] for c in CASES])
def test_em_and_f1_score_the_released_prediction(case, mode, gens, released):
    if case in PROMPT_EXAMPLE:
        released = ""
    gold = ["Paris"] if "York" not in "".join(gens) else ["New York"]
    m = episode_metrics([episode(gens, gold)], answer_of=AGENT.scored_answer)
    assert m["em"] == M.exact_match(released, gold)
    assert m["f1"] == pytest.approx(M.f1_score(released, gold))


def test_prompt_example_is_never_the_answer():
    """The released fallback the table records ("answer here"), and jaxrag's reading of the same generations."""
    recorded = {c[0]: c[3] for c in CASES}
    assert {recorded[c] for c in PROMPT_EXAMPLE} == {"answer here"}
    for case, _, gens, _ in CASES:
        if case in PROMPT_EXAMPLE:
            assert AGENT.scored_answer(episode(gens)) == ""


def test_parsed_option_scores_the_agents_answer():
    """eval_answer="parsed": the agent's parse, where an unboxed <answer> is its text (the reading Table 1 used
    before; it departs from the released evaluation exactly on the unboxed cases)."""
    parsed = get_agent("smartsearch", eval_answer="parsed")
    ep = episode(["<think> t </think>\n<answer> Paris </answer>"])
    assert parsed.scored_answer(ep) == "Paris" and AGENT.scored_answer(ep) == ""
    assert episode_metrics([ep], answer_of=parsed.scored_answer)["em"] == 1.0
    assert episode_metrics([ep], answer_of=AGENT.scored_answer)["em"] == 0.0
    with pytest.raises(ValueError, match="eval_answer"):
        get_agent("smartsearch", eval_answer="boxd")
