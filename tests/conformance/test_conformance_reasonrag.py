"""Conformance with ReasonRAG's released code: the values, rewards and pairs its MCTS data were made with.

How the tables were computed (facts, outside this repository): github wlzhang2020/ReasonRAG at commit
225e249a26fa0d1d2fd3c9bf60855d725b7cd435, run with Python 3.11 and numpy, its LLM / retriever / FlashRAG / tiktoken
imports stubbed (no model is called by the functions run):
  REWARD_CASES     preference_data_generatoin.py: `calculate_mcts_reward_bottom_up(tree, gold)` then
                   `process_node(tree, 0, results, counts)` on each tree written in the script's JSON node format
                   (`intermediate_node_<id>`: children_ids, parent_id, N, step, response, answer, input_prompt);
                   the released file misses `from collections import Counter, deque`, which was supplied. Outputs:
                   every node's `reward` (None: the key is absent) and each pair's (chosen content, rejected content,
                   layer).
  SELECTION_CASES  pipeline/reasonrag_pipeline.py: MCTSRAGNode trees grown node by node, each new node
                   backpropagated once with its judge score (`ReasonRAGPipeline.backpropagate`, as `search` does
                   after `simulate`), "revisit" entries a Terminal node selected again; outputs: each node's N, Q,
                   `_uct` (c = 1.414) and the root's `_select_child`.
Tree rows: (id, parent, kind, step, N, text); kind answer (an <answer>), query (a <query>), evidence (an <evidence>),
evidence_untagged (a response without a tag), invalid (no tag, no answer), maxdepth (a query leaf past max_iter).
Selection rows: (id, parent, judge score, terminal) or ("revisit", id, score).

jaxrag is checked with the settings of configs/reasonrag/table3.py (its `mcts.mcts` section: value_scheme "code").
"""

import pytest

from jaxrag.env.mdp import ANSWER, INVALID, QUERY, Action, Step
from jaxrag.supervision.judge_protocol import JudgeResult
from jaxrag.supervision.mcts import (REASONING, TERMINAL, Child, MCTSConfig, _make_terminal, backup, code_rewards,
                                     new_tree, run_mcts, select_child, tree_pairs, uct_score)

REWARD_CASES = [('r01_answer_beside_invalid', ['Paris'],
  [(0, None, 'root', 0, 1, ''), (1, 0, 'answer', 1, 1, 'Paris'), (2, 0, 'invalid', 1, 1, 'I am not sure')],
  {0: 0.9, 1: 0.9, 2: None}, []),
 ('r02_answer_vs_wrong_answer', ['Paris'],
  [(0, None, 'root', 0, 1, ''), (1, 0, 'answer', 1, 1, 'Paris'), (2, 0, 'answer', 1, 1, 'London')],
  {0: 0.45, 1: 0.9, 2: 0.0}, [('Paris', 'London', 0)]),
 ('r03_max_depth_leaf', ['Paris'],
  [(0, None, 'root', 0, 1, ''), (1, 0, 'query', 1, 4, 'capital of France'),
   (2, 1, 'evidence', 2, 3, 'Paris is the capital'), (3, 2, 'maxdepth', 3, 1, 'population of Paris'),
   (4, 2, 'answer', 3, 1, 'Paris'), (5, 0, 'answer', 1, 1, 'London')],
  {0: 0.5832, 1: 0.729, 2: 0.729, 3: None, 4: 0.729, 5: 0.0}, [('capital of France', 'London', 0)]),
 ('r04_childless_evidence', ['Paris'],
  [(0, None, 'root', 0, 1, ''), (1, 0, 'query', 1, 3, 'capital of France'), (2, 1, 'evidence', 2, 1, 'fact a'),
   (3, 1, 'evidence', 2, 1, 'fact b'), (4, 0, 'answer', 1, 1, 'Paris')],
  {0: 0.9, 1: None, 2: None, 3: None, 4: 0.9}, []),
 ('r05_all_leaves_rewardless', ['Paris'],
  [(0, None, 'root', 0, 1, ''), (1, 0, 'invalid', 1, 1, 'hmm'), (2, 0, 'maxdepth', 1, 1, 'more')],
  {0: None, 1: None, 2: None}, []),
 ('r06_visit_weighted_mean', ['Paris'],
  [(0, None, 'root', 0, 1, ''), (1, 0, 'query', 1, 4, 'capital of France'), (2, 1, 'answer', 2, 2, 'Paris'),
   (3, 1, 'answer', 2, 1, 'London'), (4, 0, 'answer', 1, 1, 'Paris France')],
  {0: 0.552, 1: 0.54, 2: 0.81, 3: 0.0, 4: 0.6}, [('Paris France', 'capital of France', 0), ('Paris', 'London', 1)]),
 ('r07_single_child_stops_pairs', ['Paris'],
  [(0, None, 'root', 0, 1, ''), (1, 0, 'query', 1, 3, 'capital of France'), (2, 1, 'answer', 2, 1, 'Paris'),
   (3, 1, 'answer', 2, 1, 'London')],
  {0: 0.405, 1: 0.405, 2: 0.81, 3: 0.0}, []),
 ('r08_same_content', ['Paris'],
  [(0, None, 'root', 0, 1, ''), (1, 0, 'query', 1, 2, 'Paris'), (3, 1, 'answer', 2, 1, 'Paris'),
   (2, 0, 'answer', 1, 1, 'Paris')],
  {0: 0.84, 1: 0.81, 2: 0.9, 3: 0.81}, []),
 ('r09_margin_below_001', ['Paris'],
  [(0, None, 'root', 0, 1, ''), (1, 0, 'answer', 1, 1, 'Paris France'), (2, 0, 'query', 1, 20, 'capital'),
   (3, 2, 'answer', 2, 14, 'Paris'), (4, 2, 'answer', 2, 5, 'London')],
  {0: 0.5969924812, 1: 0.6, 2: 0.5968421053, 3: 0.81, 4: 0.0}, [('Paris', 'London', 1)]),
 ('r10_untagged_evidence_not_chosen', ['Paris'],
  [(0, None, 'root', 0, 1, ''), (1, 0, 'query', 1, 5, 'capital of France'), (2, 1, 'evidence', 2, 2, 'fact a'),
   (3, 1, 'evidence_untagged', 2, 2, 'fact b'), (4, 2, 'answer', 3, 1, 'London'), (5, 3, 'answer', 3, 1, 'Paris'),
   (6, 0, 'answer', 1, 1, 'London')],
  {0: 0.30375, 1: 0.3645, 2: 0.0, 3: 0.729, 4: 0.0, 5: 0.729, 6: 0.0}, [('capital of France', 'London', 0)]),
 ('r11_yes_no', ['yes'], [(0, None, 'root', 0, 1, ''), (1, 0, 'answer', 1, 1, 'no'), (2, 0, 'answer', 1, 1, 'yes')],
  {0: 0.45, 1: 0.0, 2: 0.9}, [('yes', 'no', 0)]),
 ('r12_articles_kept', ['Eiffel Tower'],
  [(0, None, 'root', 0, 1, ''), (1, 0, 'answer', 1, 1, 'the Eiffel Tower'), (2, 0, 'answer', 1, 1, 'Eiffel Tower')],
  {0: 0.81, 1: 0.72, 2: 0.9}, [('Eiffel Tower', 'the Eiffel Tower', 0)]),
 ('r13_depth3_single_child', ['Paris'],
  [(0, None, 'root', 0, 1, ''), (1, 0, 'query', 1, 4, 'capital of France'), (2, 1, 'evidence', 2, 3, 'fact'),
   (3, 2, 'answer', 3, 1, 'Paris'), (4, 2, 'answer', 3, 1, 'Paris, France'), (5, 0, 'answer', 1, 1, 'Lyon')],
  {0: 0.486, 1: 0.6075, 2: 0.6075, 3: 0.729, 4: 0.486, 5: 0.0}, [('capital of France', 'Lyon', 0)]),
 ('r14_invalid_in_subtree', ['Paris'],
  [(0, None, 'root', 0, 1, ''), (1, 0, 'query', 1, 3, 'capital of France'), (2, 1, 'answer', 2, 1, 'London'),
   (3, 1, 'invalid', 2, 1, '???'), (4, 0, 'answer', 1, 1, 'Paris')],
  {0: 0.225, 1: 0.0, 2: 0.0, 3: None, 4: 0.9}, [('Paris', 'capital of France', 0)]),
 ('r15_three_children', ['Paris'],
  [(0, None, 'root', 0, 1, ''), (1, 0, 'answer', 1, 1, 'Paris'), (2, 0, 'answer', 1, 1, 'London'),
   (3, 0, 'answer', 1, 1, 'Paris city')],
  {0: 0.5, 1: 0.9, 2: 0.0, 3: 0.6},
  [('Paris', 'London', 0), ('Paris', 'Paris city', 0), ('Paris city', 'London', 0)]),
 ('r16_revisited_leaf', ['Paris'],
  [(0, None, 'root', 0, 1, ''), (1, 0, 'answer', 1, 3, 'Paris'), (2, 0, 'answer', 1, 1, 'London')],
  {0: 0.675, 1: 0.9, 2: 0.0}, [('Paris', 'London', 0)]),
 ('r17_several_gold', ['Paris', 'City of Paris'],
  [(0, None, 'root', 0, 1, ''), (1, 0, 'answer', 1, 1, 'city of light'), (2, 0, 'answer', 1, 1, 'Paris')],
  {0: 0.75, 1: 0.6, 2: 0.9}, [('Paris', 'city of light', 0)]),
 ('r18_max_depth_vs_wrong_answer', ['Paris'],
  [(0, None, 'root', 0, 1, ''), (1, 0, 'maxdepth', 1, 1, 'q'), (2, 0, 'answer', 1, 1, 'Rome')],
  {0: 0.0, 1: None, 2: 0.0}, [])]

SELECTION_CASES = [('s01_two_children', [(0, None, None, False), (1, 0, 0.8, False), (2, 0, 0.3, False)],
  {0: (2, 0.55, None), 1: (1, 0.8, 1.9772322202), 2: (1, 0.3, 1.4772322202)}, 1),
 ('s02_explore_less_visited',
  [(0, None, None, False), (1, 0, 0.2, False), (2, 0, 0.6, False), (3, 1, 0.9, False), (4, 1, 0.1, True)],
  {0: (4, 0.45, None),
   1: (3, 0.4, 1.3612060827),
   2: (1, 0.6, 2.2648577718),
   3: (1, 0.9, 2.3820799626),
   4: (1, 0.1, 1.5820799626)},
  2),
 ('s03_terminal_revisit', [(0, None, None, False), (1, 0, 0.7, True), (2, 0, 0.5, False), ('revisit', 1, 0.7)],
  {0: (3, 0.6333333333, None), 1: (2, 0.7, 1.7479887918), 2: (1, 0.5, 1.9820799626)}, 2),
 ('s04_tie_first_child', [(0, None, None, False), (1, 0, 0.5, False), (2, 0, 0.5, False)],
  {0: (2, 0.5, None), 1: (1, 0.5, 1.6772322202), 2: (1, 0.5, 1.6772322202)}, 1),
 ('s05_invalid_leaf_judged',
  [(0, None, None, False), (1, 0, 0.05, True), (2, 0, 0.4, False), (3, 2, 0.6, True), (4, 2, 0.3, False)],
  {0: (4, 0.3375, None),
   1: (1, 0.05, 1.7148577718),
   2: (3, 0.4333333333, 1.3945394161),
   3: (1, 0.6, 2.0820799626),
   4: (1, 0.3, 1.7820799626)},
  1),
 ('s06_random_tree',
  [(0, None, None, False), (1, 0, 0.42, False), (2, 1, 0.49, False), (3, 1, 0.36, False), (4, 0, 0.28, False),
   (5, 2, 0.25, False), (6, 3, 0.73, False), (7, 4, 0.1, False), (8, 5, 0.64, False), (9, 3, 0.48, False)],
  {0: (9, 0.4166666667, None),
   1: (7, 0.4814285714, 1.2736336343),
   2: (3, 0.46, 1.5988071198),
   3: (3, 0.5233333333, 1.6621404531),
   4: (2, 0.19, 1.6720799626),
   5: (2, 0.445, 1.4929887918),
   6: (1, 0.73, 2.2120799626),
   7: (1, 0.1, 1.2772322202),
   8: (1, 0.64, 1.8172322202),
   9: (1, 0.48, 1.9620799626)},
  4),
 ('s07_random_tree',
  [(0, None, None, False), (1, 0, 0.55, False), (2, 0, 0.84, True), (3, 1, 0.83, False), (4, 3, 0.33, True),
   (5, 1, 0.57, True)],
  {0: (5, 0.624, None),
   1: (4, 0.57, 1.4669258225),
   2: (1, 0.84, 2.633851645),
   3: (2, 0.58, 1.7572322202),
   4: (1, 0.33, 1.5072322202),
   5: (1, 0.57, 2.2348577718)},
  2),
 ('s08_random_tree',
  [(0, None, None, False), (1, 0, 0.45, False), (2, 0, 0.88, False), (3, 2, 0.55, True), (4, 1, 0.81, False),
   (5, 4, 0.8, True), (6, 4, 0.44, False), (7, 6, 0.32, False), (8, 2, 0.19, True), (9, 1, 0.98, True),
   ('revisit', 9, 0.98)],
  {0: (10, 0.64, None),
   1: (7, 0.6828571429, 1.4938335759),
   2: (3, 0.54, 1.7787869637),
   3: (1, 0.55, 2.0320799626),
   4: (4, 0.5925, 1.5787358958),
   5: (1, 0.8, 2.4648577718),
   6: (2, 0.38, 1.5572322202),
   7: (1, 0.32, 1.4972322202),
   8: (1, 0.19, 1.6720799626),
   9: (2, 0.98, 2.3747481795)},
  2),
 ('s09_random_tree', [(0, None, None, False), (1, 0, 0.13, False), (2, 0, 0.84, False), (3, 2, 0.52, False)],
  {0: (3, 0.4966666667, None), 1: (1, 0.13, 1.6120799626), 2: (2, 0.68, 1.7279887918), 3: (1, 0.52, 1.6972322202)},
  2),
 ('s10_random_tree',
  [(0, None, None, False), (1, 0, 0.9, False), (2, 1, 0.45, False), (3, 2, 0.7, False), (4, 2, 0.61, True),
   (5, 1, 0.34, False), (6, 0, 0.73, True), (7, 3, 0.37, False), (8, 3, 0.82, False), (9, 5, 0.86, False)],
  {0: (9, 0.6422222222, None),
   1: (8, 0.63125, 1.3722899813),
   2: (5, 0.59, 1.5018801567),
   3: (3, 0.63, 1.6656807301),
   4: (1, 0.61, 2.403851645),
   5: (2, 0.6, 2.0418091241),
   6: (1, 0.73, 2.8259775836),
   7: (1, 0.37, 1.8520799626),
   8: (1, 0.82, 2.3020799626),
   9: (1, 0.86, 2.0372322202)},
  6),
 ('s11_random_tree', [(0, None, None, False), (1, 0, 0.63, True), (2, 0, 0.37, False), (3, 2, 0.02, True)],
  {0: (3, 0.34, None), 1: (1, 0.63, 2.1120799626), 2: (2, 0.195, 1.2429887918), 3: (1, 0.02, 1.1972322202)}, 1),
 ('s12_random_tree',
  [(0, None, None, False), (1, 0, 0.73, False), (2, 0, 0.02, False), (3, 2, 0.84, False), (4, 1, 0.65, True),
   (5, 2, 0.06, False), (6, 3, 0.1, True), (7, 3, 0.36, True), (8, 5, 0.92, False)],
  {0: (8, 0.46, None),
   1: (2, 0.69, 2.1318091241),
   2: (6, 0.3833333333, 1.2157622193),
   3: (3, 0.4333333333, 1.5261030126),
   4: (1, 0.65, 1.8272322202),
   5: (2, 0.49, 1.8283640603),
   6: (1, 0.1, 1.5820799626),
   7: (1, 0.36, 1.8420799626),
   8: (1, 0.92, 2.0972322202)},
  1),
 ('s13_random_tree',
  [(0, None, None, False), (1, 0, 0.06, False), (2, 0, 0.34, False), (3, 2, 0.92, True), (4, 1, 0.68, True),
   (5, 2, 0.39, False), (6, 5, 0.69, True), (7, 5, 0.34, False), (8, 1, 0.13, False), ('revisit', 4, 0.68)],
  {0: (9, 0.47, None),
   1: (4, 0.3875, 1.4354887918),
   2: (5, 0.536, 1.4733496713),
   3: (1, 0.92, 2.713851645),
   4: (2, 0.68, 1.8572322202),
   5: (3, 0.4733333333, 1.5090140635),
   6: (1, 0.69, 2.1720799626),
   7: (1, 0.34, 1.8220799626),
   8: (1, 0.13, 1.7948577718)},
  2),
 ('s14_random_tree',
  [(0, None, None, False), (1, 0, 0.59, False), (2, 0, 0.39, False), (3, 2, 0.08, False), (4, 3, 0.33, True),
   (5, 1, 0.45, True), (6, 3, 0.57, False), (7, 2, 0.87, True), ('revisit', 5, 0.45), ('revisit', 7, 0.87)],
  {0: (9, 0.5111111111, None),
   1: (3, 0.4966666667, 1.7067798888),
   2: (6, 0.5183333333, 1.3740125987),
   3: (3, 0.3266666667, 1.4194363459),
   4: (1, 0.33, 1.8120799626),
   5: (2, 0.45, 1.4979887918),
   6: (1, 0.57, 2.0520799626),
   7: (2, 0.87, 2.2083640603)},
  1),
 ('s15_random_tree',
  [(0, None, None, False), (1, 0, 0.06, True), (2, 0, 0.88, False), (3, 2, 0.49, False), (4, 3, 0.05, False),
   (5, 3, 1.0, True), (6, 2, 0.13, False), (7, 4, 0.68, False), (8, 6, 0.01, True)],
  {0: (8, 0.4125, None),
   1: (1, 0.06, 2.0990260177),
   2: (7, 0.4628571429, 1.2335365371),
   3: (4, 0.555, 1.5412358958),
   4: (2, 0.365, 1.5422322202),
   5: (1, 1.0, 2.6648577718),
   6: (2, 0.07, 1.4647481795),
   7: (1, 0.68, 1.8572322202),
   8: (1, 0.01, 1.1872322202)},
  1),
 ('s16_random_tree',
  [(0, None, None, False), (1, 0, 0.61, True), (2, 0, 0.28, False), (3, 2, 0.85, True), (4, 2, 0.02, False),
   (5, 4, 0.12, False), (6, 5, 0.52, True), (7, 5, 0.15, True), (8, 4, 0.21, True), ('revisit', 8, 0.21)],
  {0: (9, 0.33, None),
   1: (1, 0.61, 2.7059775836),
   2: (8, 0.295, 1.0360399813),
   3: (1, 0.85, 2.8890260177),
   4: (6, 0.205, 1.0374288859),
   5: (3, 0.2633333333, 1.3561030126),
   6: (1, 0.52, 2.0020799626),
   7: (1, 0.15, 1.6320799626),
   8: (2, 0.21, 1.5483640603)},
  1),
 ('s17_random_tree',
  [(0, None, None, False), (1, 0, 0.91, False), (2, 0, 0.96, False), (3, 2, 0.9, False), (4, 3, 0.87, False),
   (5, 2, 0.59, True)],
  {0: (5, 0.846, None),
   1: (1, 0.91, 2.703851645),
   2: (4, 0.83, 1.7269258225),
   3: (2, 0.885, 2.0622322202),
   4: (1, 0.87, 2.0472322202),
   5: (1, 0.59, 2.2548577718)},
  1),
 ('s18_random_tree',
  [(0, None, None, False), (1, 0, 0.34, True), (2, 0, 0.34, False), (3, 2, 0.16, True), (4, 2, 0.99, False)],
  {0: (4, 0.4575, None),
   1: (1, 0.34, 2.0048577718),
   2: (3, 0.4966666667, 1.4578727494),
   3: (1, 0.16, 1.6420799626),
   4: (1, 0.99, 2.4720799626)},
  1)]


def table3_cfg() -> MCTSConfig:
    from configs.reasonrag.table3 import get_config

    return MCTSConfig(**get_config().mcts.mcts.to_dict()).validate()


RAW = {"answer": "So the answer is <answer>{}</answer>", "query": "So the next query is <query>{}</query>",
       "maxdepth": "So the next query is <query>{}</query>", "evidence": "<evidence>{}</evidence>",
       "evidence_untagged": "{}", "invalid": "{}"}


def build(rows, gold, cfg):
    """A jaxrag tree of a table's rows, leaves made Terminal as run_mcts makes them (`_make_terminal`)."""
    tree = new_tree({"id": "q", "question": "What is the capital of France?", "golden_answers": gold})
    ids, text_of = {}, {}
    for nid, parent, kind, step, n, text in rows:
        text_of[nid] = text
        if parent is None:
            ids[nid], node = 0, tree.root
        else:
            par = tree.nodes[ids[parent]]
            raw = RAW[kind].format(text)
            if kind.startswith("evidence"):
                qstep = Step(Action(QUERY, text_of[parent]), summary=None if kind == "evidence_untagged" else text)
                node = tree.add(par, stage=REASONING, depth=step, raw=raw, kind="evidence", prompt=f"p{parent}",
                                step=qstep)
            else:
                action = Action(ANSWER if kind == "answer" else INVALID if kind == "invalid" else QUERY, text, raw)
                node = tree.add(par, stage=REASONING, depth=step, raw=raw, action=action, kind="action",
                                prompt=f"p{parent}")
            ids[nid] = node.id
            par.expanded = True
            if kind in ("answer", "invalid", "maxdepth"):
                _make_terminal(tree, node, 1.0 if kind == "answer" else None, cfg,
                               reason={"invalid": "invalid", "maxdepth": "max_depth"}.get(kind, ""))
        node.N = n
    tree.metadata["value_scheme"] = cfg.value_scheme
    return tree, ids, text_of


@pytest.mark.parametrize("name, gold, rows, rewards, pairs", REWARD_CASES, ids=[c[0] for c in REWARD_CASES])
def test_rewards_and_pairs_match_the_released_script(name, gold, rows, rewards, pairs):
    cfg = table3_cfg()
    tree, ids, text_of = build(rows, gold, cfg)
    code_rewards(tree, cfg.alpha)
    got = {nid: tree.nodes[j].reward for nid, j in ids.items()}
    assert {k: v is None for k, v in got.items()} == {k: v is None for k, v in rewards.items()}
    assert {k: v for k, v in got.items() if v is not None} == pytest.approx(
        {k: v for k, v in rewards.items() if v is not None}, abs=1e-9)
    back = {j: nid for nid, j in ids.items()}
    by_raw = {tree.nodes[j].raw: text_of[back[j]] for j in back}
    got_pairs = [(by_raw[p.chosen], by_raw[p.rejected], p.step) for p in tree_pairs(tree, cfg.min_margin)]
    assert sorted(got_pairs) == sorted(pairs)


def test_the_paper_scheme_is_the_named_option_and_differs_where_the_issue_says():
    """One correct answer beside one invalid sibling: the released code's root reward is 0.90 with no pair; the
    paper's scheme (an invalid leaf scored 0 and averaged in) gives 0.45 and pairs the answer over the invalid one."""
    cfg = MCTSConfig(value_scheme="paper", uct="code", rollouts_per_node=1, judge_weight=0.0, backup="children")
    rows = REWARD_CASES[0][2]
    tree, ids, _ = build(rows, ["Paris"], cfg)
    for j in (ids[1], ids[2]):
        backup(tree, tree.nodes[j], cfg)
    assert tree.root.Q == pytest.approx(0.45) and len(tree_pairs(tree, cfg.min_margin)) == 1
    assert REWARD_CASES[0][3][0] == 0.9 and REWARD_CASES[0][4] == []


class ToyEnv:
    """Root -> [the answer "Paris", an invalid action]; one expansion."""

    def expand(self, items, n, max_depth):
        return [[Child("So the answer is <answer>Paris</answer>", TERMINAL, Action(ANSWER, "Paris", "a"), "P", 1.0),
                 Child("I am not sure", TERMINAL, Action(INVALID, "", "I am not sure"), "P", None,
                       extra={"terminal_reason": "invalid"})] for _ in items]

    def rollout(self, items, k, max_depth):
        raise AssertionError("judge-only: no rollouts")


class ScoreJudge:
    name = "scores"

    def __init__(self):
        self.requests = []

    def judge(self, requests):
        self.requests += requests
        return [JudgeResult([0.3 if r.candidates[0].kind == INVALID else 0.8]) for r in requests]


def test_search_selects_by_the_judge_and_pairs_by_the_answered_leaves():
    """run_mcts with table3's settings: both new Terminal children are judged (the code's simulate scores every new
    node), selection Q is the judges' mean (0.55), the pair value is the bottom-up reward (root 0.90), the invalid
    leaf gets no reward and no pair is made (r01 of REWARD_CASES)."""
    cfg = MCTSConfig(**{**table3_cfg().__dict__, "max_iterations": 1})
    judge = ScoreJudge()
    [tree] = run_mcts(ToyEnv(), [{"id": "q", "question": "?", "golden_answers": ["Paris"]}], cfg, judge=judge)
    a, b = tree.kids(tree.root)
    assert len(judge.requests) == 2 and (a.judge_score, b.judge_score) == (0.8, 0.3)
    assert (tree.root.N, tree.root.Q) == (2, pytest.approx(0.55))
    assert (tree.root.reward, a.reward, b.reward) == (pytest.approx(0.9), pytest.approx(0.9), None)
    assert b.rewardless and tree_pairs(tree, cfg.min_margin) == []


@pytest.mark.parametrize("name, rows, nodes, picked", SELECTION_CASES, ids=[c[0] for c in SELECTION_CASES])
def test_selection_values_match_the_released_search(name, rows, nodes, picked):
    cfg = table3_cfg()
    tree = new_tree({"id": "q", "question": "?", "golden_answers": []})
    ids = {}
    for row in rows:
        if row[0] == "revisit":
            tree.nodes[ids[row[1]]].visits += 1
            continue
        nid, parent, score, terminal = row
        if parent is None:
            ids[nid] = 0
            continue
        par = tree.nodes[ids[parent]]
        par.expanded = True
        node = tree.add(par, stage=TERMINAL if terminal else REASONING, depth=par.depth + 1)
        node.visits, node.own_q, node.judge_score = 1, score, score
        ids[nid] = node.id
    for node in reversed(tree.nodes):
        backup(tree, node, cfg)
    for nid, (n, q, uct) in nodes.items():
        node = tree.nodes[ids[nid]]
        assert (node.N, node.Q) == (n, pytest.approx(q, abs=1e-9)), nid
        if node.parent is not None:
            par = tree.nodes[node.parent]
            assert uct_score(cfg, par, node, tree.kids(par)) == pytest.approx(uct, abs=1e-9), nid
    assert select_child(tree, tree.root, cfg).id == ids[picked]
