"""Intervals (jaxrag/evaluate.py): binomial and over-seed standard errors, the paired two-way bootstrap."""
import numpy as np
import pytest

from jaxrag.evaluate import binomial_se, describe_difference, mean_se, paired_bootstrap


def test_standard_errors_by_hand():
    assert binomial_se(0.3, 200) == pytest.approx(np.sqrt(0.3 * 0.7 / 200))   # 0.0324: the "about 0.03"
    m, se = mean_se([0.29, 0.30, 0.31])
    assert m == pytest.approx(0.30) and se == pytest.approx(0.01 / np.sqrt(3))  # sd 0.01 (ddof 1) / sqrt 3
    assert np.isnan(mean_se([0.5])[1])
    with pytest.raises(ValueError, match="no values"):
        mean_se([])


def test_two_questions_one_seed_match_the_exact_bootstrap_distribution():
    """d = (0, 1): a resample's mean is 0, 1/2 or 1 with chances 1/4, 1/2, 1/4, so the 95 % interval is [0, 1], the
    mean 0.5, and 1/4 of the replicates are <= 0."""
    r = paired_bootstrap([[1, 1]], [[1, 0]], n_boot=40_000)
    assert (r["diff"], r["lo"], r["hi"]) == (0.5, 0.0, 1.0) and r["share_le_0"] == pytest.approx(0.25, abs=0.01)
    assert (r["n_seeds"], r["n_questions"]) == (1, 2)


def test_identical_systems_and_constant_differences_give_point_intervals():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2, (3, 50))
    r = paired_bootstrap(a, a)
    assert r["diff"] == r["lo"] == r["hi"] == 0.0
    r = paired_bootstrap(a + 0.25, a)
    assert r["lo"] == pytest.approx(0.25) and r["hi"] == pytest.approx(0.25)


def test_the_interval_width_matches_the_normal_approximation_for_one_seed():
    """One seed, many questions: the bootstrap SD of the mean difference is sd(d) / sqrt(Q), so the 95 % interval is
    about mean +/- 1.96 sd(d) / sqrt(Q)."""
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 2, 400), rng.integers(0, 2, 400)
    r = paired_bootstrap(a, b, n_boot=20_000)
    half = 1.96 * np.std(a - b) / np.sqrt(400)
    assert (r["hi"] - r["lo"]) / 2 == pytest.approx(half, rel=0.05)
    assert r["lo"] < r["diff"] < r["hi"]


def test_seed_noise_widens_the_interval():
    """Two seeds whose differences disagree (+0.2 and -0.2 on every question): resampling seeds must show it."""
    d = np.array([[0.2] * 100, [-0.2] * 100])
    r = paired_bootstrap(d, np.zeros_like(d), n_boot=20_000)
    assert r["lo"] == pytest.approx(-0.2) and r["hi"] == pytest.approx(0.2)
    assert "no difference detectable" in describe_difference("dpo", "sft", r)


def test_mismatched_shapes_are_refused():
    with pytest.raises(ValueError, match="same seeds x questions"):
        paired_bootstrap(np.zeros((2, 3)), np.zeros((2, 4)))
    assert describe_difference("a", "b", {"diff": 0.1, "lo": 0.05, "hi": 0.15, "n_seeds": 3,
                                          "n_questions": 200}).startswith("a above b: +0.100")
