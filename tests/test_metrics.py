import pytest

from jaxrag import metrics as M


def official_normalize(s):
    """The HotpotQA / SQuAD v1.1 evaluation script's normalize_answer, restated as the reference."""
    import re
    import string
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


@pytest.mark.parametrize("s,want", [
    ("The Eiffel Tower!", "eiffel tower"), ("  an  apple,  a day ", "apple day"), ("snake_case_name", "snakecasename"),
    ("$5 million", "5 million"), ("<Paris>", "paris"), ("a+b=c^2 | x~y `z`", "abc2 xy z"),
    ("Café «Bar»", "café «bar»"), ("ＡＢＣ", "ａｂｃ"), ("1,000.5", "10005"), ("Theatre the", "theatre"),
    ("", ""), ("¿Qué?", "¿qué"), ("Smith–Jones", "smith–jones"),
])
def test_normalize_is_the_official_script(s, want):
    assert M.normalize_answer(s) == want == official_normalize(s)


@pytest.mark.parametrize("s,want", [
    ("snake_case_name", "snake case name"), ("Café «Bar»", "cafe bar"), ("ＡＢＣ", "abc"), ("¿Qué?", "que"),
    ("$5 million", "5 million"), ("Smith–Jones", "smithjones"),
])
def test_unicode_normalization_is_an_explicit_option(s, want):
    assert M.normalize_answer(s, "unicode") == want
    with pytest.raises(ValueError, match="normalization must be one of"):
        M.normalize_answer(s, "nfkc")


def test_symbols_are_punctuation_in_every_answer_metric():
    assert M.exact_match("$5 million", ["5 million"]) == 1.0
    assert M.exact_match("<Paris>", "Paris") == 1.0
    assert M.f1_score("$5 million", ["5 million"]) == 1.0
    assert M.cover_exact_match("about $5 million", ["5 million"]) == 1.0
    assert M.exact_match("Café", ["cafe"]) == 0.0 and M.exact_match("Café", ["cafe"], normalization="unicode") == 1.0
    from jaxrag.env.mdp import answer_reward       # the rollout reward takes the official path
    assert answer_reward("<Paris>", ["Paris"], "em") == 1.0 and answer_reward("Café", ["cafe"], "em") == 0.0


def test_exact_match_max_over_golds_and_none():
    assert M.exact_match("the Beatles", ["Rolling Stones", "Beatles"]) == 1.0
    assert M.exact_match("Beatles band", ["Beatles"]) == 0.0
    assert M.exact_match(None, ["x"]) == 0.0
    assert M.exact_match("May 29, 1932", "may 29 1932") == 1.0


def test_f1_values():
    # pred tokens: [barack, obama] vs gold [obama] -> p=1/2, r=1 -> 2/3
    assert M.f1_score("Barack Obama", ["Obama"]) == pytest.approx(2 / 3)
    assert M.f1_score("Barack Obama", ["Michelle", "Barack Hussein Obama"]) == pytest.approx(2 * 1 * (2 / 3) / (1 + 2 / 3))
    assert M.f1_score("the", ["a"]) == 0.0          # both normalize to empty
    assert M.f1_score("yes", ["no"]) == 0.0
    assert M.f1_score("no way", ["no"]) == 0.0      # yes/no special case
    assert M.f1_score("1 1 2", ["1 2 2"]) == pytest.approx(2 / 3)  # multiset overlap 2 of 3 each


def test_cover_exact_match_is_flashrag_substring():
    assert M.cover_exact_match("It was 1,000 people", ["1000"]) == 1.0
    assert M.cover_exact_match("Paris, France", ["paris"]) == 1.0
    assert M.cover_exact_match("Parisian", ["paris"]) == 1.0       # substring, as FlashRAG's acc
    assert M.cover_exact_match("in 1990", ["1"]) == 1.0
    assert M.cover_exact_match("Lyon", ["paris", "lyon"]) == 1.0 and M.cover_exact_match("Lyon", ["paris"]) == 0.0
    assert M.cover_exact_match("x", [""]) == 0.0 and M.cover_exact_match("x", ["The"]) == 0.0   # empty gold
    assert M.cover_exact_match(None, ["x"]) == 0.0


def test_choice_accuracy_letters_and_texts():
    ch = ["Inhibition of proteasome", "Cross-linking of DNA", "Generation of free radicals", "Microtubules"]
    for pred in ["B", "(B)", "B.", "b)", "Answer: B", "The answer is B", "**B**", "cross-linking of DNA", "B. Cross-linking"]:
        assert M.choice_accuracy(pred, ["Cross-linking of DNA"], ch) == 1.0, pred
    for pred in ["A", "C", "Bx", "", None, "a dog"]:
        assert M.choice_accuracy(pred, ["Cross-linking of DNA"], ch) == 0.0, pred
    assert M.choice_accuracy("D", "D", ch) == 1.0


def test_search_stats_se_sq():
    assert M.search_count_stats([0, 9, 3]) == {"min": 0.0, "max": 9.0, "mean": 4.0}
    assert M.search_efficiency([1.0, 0.5, 0.0], [2, 0, 5]) == pytest.approx((0.5 + 0.5 + 0) / 3)
    q = M.search_quality([True, True, False, False], [[True, True], [True, False], [False, True], [False]])
    assert q == {"perfect": 0.25, "partial": 0.25, "sq": 0.5}


def test_arena_scores():
    good = "<relevance>[1, 3]</relevance>\n<analysis>x</analysis>\n<answer>Paris</answer>"
    assert M.arena_format_score(good) == 1.0
    assert M.arena_format_score("<analysis>x</analysis><relevance>[1]</relevance><answer>a</answer>") == 0.0
    assert M.arena_format_score("<relevance>[1]</relevance><answer>a</answer>") == 0.0
    assert M.arena_relevance_score([1, 3], [3, 1]) == 1.0
    assert M.arena_relevance_score([1, 2], [3, 1]) == 0.5
    assert M.arena_relevance_score([], [1]) == 0.0
    r = M.arena_reward(good, "Paris", ["paris"], [1, 3], [1, 3])
    assert r["total"] == 13.0 and r["bonus"] == 10.0
    assert M.arena_reward(good, "Lyon", ["paris"], [1, 3], [1, 3])["total"] == 2.0


def test_invalid_rate():
    assert M.invalid_rate([1, 0, 2], [2, 3, 5]) == pytest.approx(0.3)
    assert M.invalid_rate([], []) == 0.0


def test_answer_in_docs_is_token_aligned_after_official_normalization():
    docs = ["The capital of France is Paris.", "It was founded in 1990 by A. Smith"]
    assert M.answer_in_docs(["paris"], docs) == 1.0                 # case and punctuation normalized away
    assert M.answer_in_docs(["$5 million", "Lyon"], ["it cost 5 million dollars"]) == 1.0  # symbols deleted, any gold
    assert M.answer_in_docs("1", docs) == 0.0                       # a whole-token span: "1" is not in "1990"
    assert M.answer_in_docs(["1990"], docs) == 1.0
    assert M.answer_in_docs(["The"], docs) == 0.0                   # a gold that normalizes to "" never counts
    assert M.answer_in_docs(["Paris"], []) == 0.0


def test_title_recall_counts_gold_titles_found():
    assert M.title_recall(["Ada Lovelace", "Charles  Babbage"], ["charles babbage", "x"]) == 0.5
    assert M.title_recall(["A", "A", "B"], ["a", "b"]) == 1.0       # gold titles are a set
    assert M.title_recall([], ["a"]) is None and M.title_recall([" "], ["a"]) is None
