"""Conformance with RAG-Gym's released code: how a judge's ranking becomes rewards, and rewards become DPO pairs.

How the tables were computed (facts, outside this repository): github RAG-Gym/RAG-Gym at commit
2abbdd48380b3a27eb143be67f29410a8ed5d5e6, run with Python 3.11, torch / trl / peft / datasets stubbed (no model is
called by the code run):
  RANK_CASES  rag_gym/rewards/lm_rerank.py: `LMReranker.__call__(state, actions)` with n query actions and the judge
              LLM replaced by one that returns the case's reply; output: the reward list it returns.
  PAIR_CASES  rag_gym/algorithms/prm/dpo/dpo.py: `dpo_training(agent, rollout_dir, ...)` on one kept trajectory
              (prediction = answer "Paris", F1 1) whose `action_cache` holds the case's (action_string, reward) per
              state, eval_ratio 0; `Dataset.from_list` captured the training rows (the trainer never ran); the script
              reads a module global `agent_type` set only under __main__, which was set to "react". Output: each
              row's (chosen, rejected) assistant texts, sorted.

jaxrag is checked with the settings of configs/rag_gym/dpo.py (its collect stage: judge options and ranking).
"""

import pytest

from jaxrag.env.mdp import QUERY, Action, State
from jaxrag.supervision import prompts as P
from jaxrag.supervision.judge_protocol import JudgeRequest
from jaxrag.supervision.judges import plan_calls
from jaxrag.supervision.ranking import RankingConfig, ranking_pairs
from jaxrag.supervision.records import ProcessRecord, ScoredCandidate

RANK_CASES = [('k01_fenced_permutation', '```json{"ranked_indices": [2, 0, 1]}```', 3, [0.5, 0.3333333333333333, 1.0]),
 ('k02_fenced_newlines', '```json\n{"ranked_indices": [1, 0]}\n```', 2, [0.5, 1.0]),
 ('k03_bare_json_no_fence', '{"ranked_indices": [1, 0]}', 2, [0, 0]),
 ('k04_fence_without_json_tag', '```\n{"ranked_indices": [1, 0]}\n```', 2, [0, 0]),
 ('k05_text_before_fence', 'Here is my ranking:\n```json{"ranked_indices": [0, 2, 1]}```', 3,
  [1.0, 0.3333333333333333, 0.5]),
 ('k06_missing_index', '```json{"ranked_indices": [0, 1]}```', 3, [0, 0, 0]),
 ('k07_extra_out_of_range_index', '```json{"ranked_indices": [2, 0, 1, 3]}```', 3, [0.5, 0.3333333333333333, 1.0]),
 ('k08_repeated_index', '```json{"ranked_indices": [0, 0, 1, 2]}```', 3, [1.0, 0.3333333333333333, 0.25]),
 ('k09_single_quoted_dict', "```json{'ranked_indices': [1, 0]}```", 2, [0.5, 1.0]),
 ('k10_wrong_key', '```json{"ranking": [0, 1]}```', 2, [0, 0]),
 ('k11_two_fenced_blocks_first_wins', '```json{"ranked_indices": [1, 0]}``` or ```json{"ranked_indices": [0, 1]}```',
  2, [0.5, 1.0]),
 ('k12_empty_reply', '', 2, [0, 0]),
 ('k13_json_true_literal', '```json{"ranked_indices": [0, 1], "sure": true}```', 2, [0, 0]),
 ('k14_nested_braces', '```json{"a": {"b": 1}, "ranked_indices": [1, 0]}```', 2, [0, 0]),
 ('k15_string_indices', '```json{"ranked_indices": ["1", "0"]}```', 2, [0, 0]),
 ('k16_single_action', '```json{"ranked_indices": [0]}```', 1, [1.0]),
 ('k17_trailing_single_backtick', '```json {"ranked_indices": [1, 0]} `', 2, [0.5, 1.0]),
 ('k18_float_indices', '```json{"ranked_indices": [1.0, 0.0]}```', 2, [0.5, 1.0]),
 ('k19_negative_extra_index', '```json{"ranked_indices": [-1, 0, 1]}```', 2, [0.5, 0.3333333333333333]),
 ('k20_list_not_permutation_order_of_ten', '```json{"ranked_indices": [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]}```', 10,
  [0.1, 0.1111111111111111, 0.125, 0.14285714285714285, 0.16666666666666666, 0.2, 0.25, 0.3333333333333333, 0.5,
   1.0])]

PAIR_CASES = [('p01_repeated_chosen', [[('A', 1.0), ('A', 1.0), ('B', 0.1)]], [('A', 'B')]),
 ('p02_repeated_rejected', [[('A', 1.0), ('B', 0.2), ('B', 0.2)]], [('A', 'B')]),
 ('p03_both_repeated', [[('A', 1.0), ('A', 1.0), ('B', 0.1), ('B', 0.1)]], [('A', 'B')]),
 ('p04_ten_ranked_candidates',
  [[('c0', 1.0), ('c1', 0.5), ('c2', 0.3333333333333333), ('c3', 0.25), ('c4', 0.2), ('c5', 0.16666666666666666),
    ('c6', 0.14285714285714285), ('c7', 0.125), ('c8', 0.1111111111111111), ('c9', 0.1)]],
  [('c0', 'c2'), ('c0', 'c3'), ('c0', 'c4'), ('c0', 'c5'), ('c0', 'c6'), ('c0', 'c7'), ('c0', 'c8'), ('c0', 'c9')]),
 ('p05_same_text_chosen_and_rejected', [[('A', 1.0), ('A', 0.2), ('B', 0.1)]], [('A', 'A'), ('A', 'B')]),
 ('p06_no_chosen', [[('A', 0.5), ('B', 0.2)]], []), ('p07_no_rejected', [[('A', 1.0), ('B', 0.5)]], []),
 ('p08_thresholds_strict', [[('A', 0.75), ('B', 0.5), ('C', 0.76), ('D', 0.49)]], [('C', 'D')]),
 ('p09_two_states', [[('A', 1.0), ('B', 0.1)], [('C', 1.0), ('D', 0.0), ('E', 0.3)]],
  [('A', 'B'), ('C', 'D'), ('C', 'E')]),
 ('p10_whitespace_differs', [[('A', 1.0), ('A ', 1.0), ('B', 0.0)]], [('A', 'B'), ('A ', 'B')]),
 ('p11_failed_parse_all_zero', [[('A', 0), ('B', 0), ('C', 0)]], []),
 ('p12_many_repeats', [[('A', 1.0), ('A', 1.0), ('A', 1.0), ('B', 0.1), ('B', 0.1), ('C', 0.0)]],
  [('A', 'B'), ('A', 'C')]),
 ('p13_two_chosen_one_rejected', [[('A', 1.0), ('B', 0.9), ('C', 0.2)]], [('A', 'C'), ('B', 'C')]),
 ('p14_step_score_ties', [[('A', 1.0), ('B', 1.0), ('C', 0.0), ('C', 0.0)]], [('A', 'C'), ('B', 'C')]),
 ('p15_repeat_across_states', [[('A', 1.0), ('B', 0.1)], [('A', 1.0), ('A', 1.0), ('B', 0.1)]],
  [('A', 'B'), ('A', 'B')]),
 ('p16_ranked_with_repeats', [[('A', 1.0), ('B', 0.5), ('A', 0.3333333333333333), ('C', 0.25), ('C', 0.2)]],
  [('A', 'A'), ('A', 'C')])]


def collect_section():
    from configs.rag_gym.dpo import get_config

    return get_config().collect


def scores(reply: str, n: int) -> list[float]:
    """jaxrag's rewards for the n actions, read through the judge's call plan with the config's prompt options; a
    failure gives the state no reward (None), which makes no pair, as the released code's all-zero rewards make
    none: written as 0 here."""
    opts = P.PromptOptions(**collect_section().judge.options.to_dict())
    req = JudgeRequest("rank", State("question?", []), [Action(QUERY, f"q{i}", f"q{i}") for i in range(n)])
    [call] = plan_calls(req, opts)
    parsed = call.parse(reply)
    return list(parsed.scores) if parsed.ok else [0] * n


@pytest.mark.parametrize("name, reply, n, rewards", RANK_CASES, ids=[c[0] for c in RANK_CASES])
def test_ranking_rewards_match_lm_rerank(name, reply, n, rewards):
    assert scores(reply, n) == pytest.approx(rewards)


def test_lenient_parse_is_the_named_option():
    """Without the code fence the released code scores every action 0; `rank_parse = "lenient"` reads the object."""
    [(_, reply, n, rewards)] = [c for c in RANK_CASES if c[0] == "k03_bare_json_no_fence"]
    assert rewards == [0, 0] and P.parse_rank(reply, n, "lenient").scores == [0.5, 1.0]


def records(steps) -> list[ProcessRecord]:
    return [ProcessRecord("q", "Q?", ["Paris"], "react", [], f"state {i}",
                          [ScoredCandidate(text, Action(QUERY, text, text), score=r) for text, r in state], "rank:x", i)
            for i, state in enumerate(steps)]


# released pairs of a text with itself (a candidate sampled twice and ranked on both sides): jaxrag leaves them out
SELF_PAIRS = {"p05_same_text_chosen_and_rejected": [("A", "A")], "p16_ranked_with_repeats": [("A", "A")]}


@pytest.mark.parametrize("name, steps, pairs", PAIR_CASES, ids=[c[0] for c in PAIR_CASES])
def test_pairs_match_dpo_training(name, steps, pairs):
    rc = RankingConfig(**collect_section().ranking.to_dict())
    got = sorted((p.chosen, p.rejected) for p in ranking_pairs(records(steps), dedup=rc.pair_dedup))
    assert all(p in pairs for p in SELF_PAIRS.get(name, []))
    assert got == sorted(p for p in pairs if p not in SELF_PAIRS.get(name, []))


def test_no_dedup_is_the_named_option():
    """A repeated candidate: the released code makes its pair once; pair_dedup=False once per sampled copy."""
    [(_, steps, pairs)] = [c for c in PAIR_CASES if c[0] == "p03_both_repeated"]
    assert pairs == [("A", "B")] and len(ranking_pairs(records(steps), dedup=False)) == 4
