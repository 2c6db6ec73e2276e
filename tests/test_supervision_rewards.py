"""ARENA adaptive reward against the paper's definition (003 §3.3), and the papers' rewards in the registry."""
import pytest

from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import ANSWER, Episode, Step
from jaxrag.supervision.arena_reward import arena_episode_reward, strict_format_score
from jaxrag.supervision.rewards import REWARDS, get_reward, reward_fn

ARENA = get_agent("arena")
GOLD_IDS = [1, 3]


def arena_episode(text: str) -> Episode:
    """One ARENA step parsed by the agent; gold answer "Paris", supporting references 1 and 3."""
    action = ARENA.parse(text)
    ep = Episode("q", "capital?", ["Paris"], agent="arena", steps=[Step(action)],
                 answer=action.text if action.kind == ANSWER else None,
                 done="answer" if action.kind == ANSWER else "invalid", metadata={"gold_ref_ids": list(GOLD_IDS)})
    return ep


REL, ANA = "<relevance>[1, 3]</relevance>\n", "<analysis>[1] and [3] say so</analysis>\n"


@pytest.mark.parametrize("text,fmt,acc,rel,bonus", [
    (REL + ANA + "<answer>Paris</answer>", 1, 1, 1, 10),                                # all three: bonus
    ("<relevance>[1]</relevance>" + ANA + "<answer>Paris</answer>", 1, 1, 0.5, 0),       # partial relevance
    ("<relevance>[1, 2, 3]</relevance>" + ANA + "<answer>Paris</answer>", 1, 1, 0.5, 0),  # superset overlaps
    ("<relevance>[2, 4]</relevance>" + ANA + "<answer>Paris</answer>", 1, 1, 0, 0),      # no overlap
    (REL + "<answer>Paris</answer>", 0, 1, 1, 0),                                         # analysis missing
    (ANA + REL + "<answer>Paris</answer>", 0, 1, 1, 0),                                   # sections out of order
    (REL + ANA + "<answer>London</answer>", 1, 0, 1, 0),                                  # wrong answer
    (REL + ANA + "<answer>the Paris.</answer>", 1, 1, 1, 10),                             # normalized EM
    (REL + ANA + "<answer>Paris, France</answer>", 1, 0, 1, 0),                           # EM, not F1
    (REL + "<analysis>no answer section</analysis>", 0, 0, 1, 0),  # no answer: the code still scores <relevance>
])
def test_arena_reward_table(text, fmt, acc, rel, bonus):
    r = arena_episode_reward(arena_episode(text))
    assert r.components == {"format": fmt, "accuracy": acc, "relevance": rel, "bonus": bonus}
    assert r.total == pytest.approx(fmt + acc + rel + bonus)


def test_arena_without_gold_ids_and_the_format_options():
    ep = arena_episode(REL + ANA + "<answer>Paris</answer>")
    ep.metadata = {}
    assert arena_episode_reward(ep).components["relevance"] == 0.0
    # default ("strict", the released code's regex): the reply must start with the sections, no '<' inside them
    chatty = "Sure! " + REL + ANA + "<answer>Paris</answer>"
    strict = arena_episode_reward(arena_episode(chatty))
    assert strict.components["format"] == 0.0 and strict.components["bonus"] == 0.0 and strict.total == 2.0
    assert arena_episode_reward(arena_episode(chatty), format="lenient").total == 13.0
    assert get_reward("arena_lenient")(arena_episode(chatty)).total == 13.0
    assert strict_format_score(REL + ANA + "<answer>Paris</answer>") == 1.0
    assert strict_format_score(REL + "<analysis>a <b> c</analysis><answer>Paris</answer>") == 0.0
    with pytest.raises(ValueError, match="format must be one of"):
        arena_episode_reward(ep, format="loose")


def test_registry_holds_the_papers_rewards():
    assert get_reward("arena")(arena_episode(REL + ANA + "<answer>Paris</answer>")).total == 13.0
    assert get_reward("smartsearch").__module__ == "jaxrag.supervision.smartsearch" and "smartsearch" in REWARDS
    both = reward_fn("em+0.5*arena")(arena_episode(REL + ANA + "<answer>Paris</answer>"))
    assert both.total == pytest.approx(1.0 + 0.5 * 13.0) and both.components["arena/bonus"] == 10.0


def searched_episode(answer, searches: int) -> Episode:
    """`searches` query steps, then the answer (None: the episode ended without one); gold "Jean Dupont"."""
    from jaxrag.env.mdp import Action, QUERY

    steps = [Step(Action(QUERY, f"q{i}")) for i in range(searches)]
    if answer is not None:
        steps.append(Step(Action(ANSWER, answer)))
    return Episode("q", "who?", ["Jean Dupont"], agent="react", steps=steps, answer=answer,
                   done="answer" if answer is not None else "max_steps")


@pytest.mark.parametrize("spec,answer,searches,total,f1", [
    # F1("Jean Dupont", gold) = 1; each search costs the penalty (default 0.05)
    ("f1_search_penalty", "Jean Dupont", 0, 1.0, 1.0),
    ("f1_search_penalty", "Jean Dupont", 3, 0.85, 1.0),
    # "Dupont": precision 1, recall 1/2 -> F1 2/3; minus 2 x 0.1
    ("f1_search_penalty(0.1)", "Dupont", 2, 2 / 3 - 0.2, 2 / 3),
    # wrong answer: floored at 0 however many searches
    ("f1_search_penalty(0.1)", "Paris", 4, 0.0, 0.0),
    ("f1_search_penalty(0.1)", None, 5, 0.0, 0.0),
    # "Jean Paul Dupont": precision 2/3, recall 1 -> F1 0.8; 8 searches x 0.1 pass the floor 0 ...
    ("f1_search_penalty(0.1)", "Jean Paul Dupont", 8, 0.0, 0.8),
    # ... and a floor of -1 lets the penalty through: 0.8 - 0.8 = 0, 0 - 0.5 = -0.5
    ("f1_search_penalty(0.1, -1)", "Jean Paul Dupont", 8, 0.0, 0.8),
    ("f1_search_penalty(0.1, -1)", "Paris", 5, -0.5, 0.0),
])
def test_f1_search_penalty_against_hand_computed_values(spec, answer, searches, total, f1):
    r = reward_fn(spec)(searched_episode(answer, searches))
    assert r.total == pytest.approx(total)
    assert r.components == pytest.approx({"f1": f1, "searches": float(searches)})


def test_f1_search_penalty_spec_errors_name_the_reward():
    with pytest.raises(ValueError, match="penalty -0.1 < 0"):
        get_reward("f1_search_penalty(-0.1)")
    with pytest.raises(ValueError, match="must be numbers"):
        get_reward("f1_search_penalty(a lot)")
    with pytest.raises(ValueError, match=r"f1_search_penalty\(1.0, 2.0, 3.0\)"):
        get_reward("f1_search_penalty(1, 2, 3)")
    with pytest.raises(ValueError, match="'em' takes no settings"):
        get_reward("em(0.5)")
    # inside a weighted spec: 0.5 x (1 - 0.1) + 1 x EM(1)
    assert reward_fn("0.5*f1_search_penalty(0.1)+em")(searched_episode("Jean Dupont", 1)).total == pytest.approx(1.45)
