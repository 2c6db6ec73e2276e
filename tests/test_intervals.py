"""Intervals (jaxrag/evaluate.py): binomial and over-seed standard errors, the paired two-way bootstrap, the paired
variance components (SE, interval, minimal detectable effect, disagreement)."""
import numpy as np
import pytest

from jaxrag.evaluate import binomial_se, describe_difference, mean_se, paired_bootstrap, paired_components


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


def test_variance_components_by_hand():
    """d = seed effect + question effect, no residual: the mean squares give the components exactly, and the SE is
    sqrt(var_seed / S + var_question / Q)."""
    seed, question = np.array([0.1, -0.1, 0.0]), np.array([0.0, 0.2, 0.4, 0.2])
    d = 0.05 + seed[:, None] + question[None, :]
    r = paired_components(d, np.zeros_like(d))
    assert r["diff"] == pytest.approx(0.05 + question.mean()) and r["var_resid"] == pytest.approx(0.0, abs=1e-15)
    assert r["var_seed"] == pytest.approx(np.var(seed, ddof=1)) and r["var_question"] == pytest.approx(
        np.var(question, ddof=1))
    assert r["se"] == pytest.approx(np.sqrt(np.var(seed, ddof=1) / 3 + np.var(question, ddof=1) / 4))
    assert r["disagree"] == pytest.approx(np.mean(d != 0))
    from scipy import stats
    t = stats.t.ppf(0.975, r["df"])
    assert (r["lo"], r["hi"]) == pytest.approx((r["diff"] - t * r["se"], r["diff"] + t * r["se"]))
    assert r["mde"] == pytest.approx((t + stats.t.ppf(0.8, r["df"])) * r["se"])


def test_one_seed_is_the_question_standard_error():
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 2, 300), rng.integers(0, 2, 300)
    r = paired_components(a, b)
    assert r["se"] == pytest.approx(np.std(a - b, ddof=1) / np.sqrt(300)) and r["df"] == 299
    assert r["disagree"] == pytest.approx(np.mean(a != b)) and np.isnan(r["var_seed"])
    assert r["mde"] == pytest.approx(2.80 * r["se"], rel=0.01)            # z_0.975 + z_0.8 at 299 df


def test_components_se_is_the_true_sd_and_the_bootstrap_overstates_it():
    """Simulated seeds x questions with known components, residual-dominated as paired EM is: the components' SE is
    close to the true SD of the mean difference and its 95 % interval covers 0 about 95 % of the time; the two-way
    bootstrap's SE is about 1.5x the truth (it counts the residual twice)."""
    rng = np.random.default_rng(0)
    S, Q, sd_seed, sd_q, sd_e = 3, 200, 0.01, 0.1, 0.4
    truth = np.sqrt(sd_seed ** 2 / S + sd_q ** 2 / Q + sd_e ** 2 / (S * Q))
    draw = lambda: rng.normal(0, sd_seed, (S, 1)) + rng.normal(0, sd_q, (1, Q)) + rng.normal(0, sd_e, (S, Q))
    runs = [paired_components(d, np.zeros_like(d)) for d in (draw() for _ in range(400))]
    assert np.mean([r["se"] for r in runs]) == pytest.approx(truth, rel=0.15)
    assert 0.92 <= np.mean([r["lo"] <= 0 <= r["hi"] for r in runs]) <= 0.99
    boot = [paired_bootstrap(d, np.zeros_like(d), n_boot=4000) for d in (draw() for _ in range(40))]
    assert np.mean([(r["hi"] - r["lo"]) / (2 * 1.96) for r in boot]) / truth > 1.3
