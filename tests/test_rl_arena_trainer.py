"""ARENA's trainer settings in the RL loop: the token mean per micro-batch of completions (its TRL fork's
compute_loss per device micro-batch, averaged over devices and accumulation steps) and log-probs scored at T = 1
while sampling at 0.9 (its _get_per_token_logps has no temperature)."""
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrag import losses
from jaxrag.rl import rows as R
from jaxrag.rl.config import RLConfig, rl_train_config
from jaxrag.rl.loop import choose_layout, rescore_old_logp
from jaxrag.train.config import default_train_config


def random_rows(rng, n_episodes: int, rows_per_episode=(1, 3)):
    """Rows of n episodes (1 to 2 rows each, 1 to 9 generated ids per row, prompts of 2 ids)."""
    out = []
    for e in range(n_episodes):
        for s in range(int(rng.integers(*rows_per_episode))):
            n = int(rng.integers(1, 10))
            out.append(R.Row(e, s, [5, 6], list(rng.integers(10, 50, n)), [0.0] * n))
    return out


def trl_micro_batch_mean(per_episode_tokens: list[np.ndarray], micro: int) -> float:
    """ARENA's TRL loss: (Σ_{i∈m} Σ_t x_it) / (Σ_{i∈m} |o_i|) per micro-batch m of `micro` completions, then
    the mean over micro-batches (the gradient average over devices and accumulation steps)."""
    chunks = [per_episode_tokens[i:i + micro] for i in range(0, len(per_episode_tokens), micro)]
    return float(np.mean([np.concatenate(c).sum() / sum(len(x) for x in c) for c in chunks]))


@pytest.mark.parametrize("n_episodes,micro", [(8, 4), (28, 4), (7, 4), (12, 3), (5, 1)])
def test_micro_batch_token_mean_weights_match_trl(n_episodes, micro):
    rng = np.random.default_rng(n_episodes * 10 + micro)
    rows = random_rows(rng, n_episodes)
    w = R.row_weights(rows, "token_mean", 0, micro=micro)
    x = [rng.normal(size=r.generated) for r in rows]   # any per-token objective
    per_episode = [np.concatenate([xi for r, xi in zip(rows, x) if r.episode == e]) for e in range(n_episodes)]
    assert sum(wi * xi.sum() for wi, xi in zip(w, x)) == pytest.approx(trl_micro_batch_mean(per_episode, micro))
    assert sum(wi * r.generated for wi, r in zip(w, rows)) == pytest.approx(1.0)
    if n_episodes > micro:   # not the whole-batch token mean unless every chunk has as many tokens
        whole = R.row_weights(rows, "token_mean", 0)
        assert not np.allclose(w, whole)


def test_grpo_loss_with_micro_weights_is_trls_loss():
    """One GRPO update of 8 one-row episodes (ARENA: one generation each) through losses.grpo_loss with the batch's
    token_weight equals TRL's per-micro-batch loss on the same numbers, k2 KL, ratio 1 (one iteration)."""
    rng = np.random.default_rng(0)
    rows = [R.Row(e, 0, [5, 6], list(rng.integers(10, 50, int(n))), [0.0] * int(n))
            for e, n in enumerate(rng.integers(2, 7, 8))]
    adv = rng.normal(size=8).astype(np.float32)
    b = R.grpo_batch(rows, adv, "token_mean", 0, (32,), micro=4)
    logp = rng.normal(size=b["tokens"].shape).astype(np.float32) - 2.0
    ref = logp + rng.normal(scale=0.1, size=logp.shape).astype(np.float32)
    beta = 0.04
    loss, _ = losses.grpo_loss(jnp.asarray(logp), jnp.asarray(logp), jnp.asarray(ref), jnp.asarray(b["loss_mask"]),
                               jnp.asarray(b["advantages"]), 0.2, beta, "k2", "token_mean",
                               weights=jnp.asarray(b["token_weight"]))
    per_token = -b["advantages"][:, None] + beta * 0.5 * (ref - logp) ** 2   # -min(ρA, clip(ρ)A) + βKL at ρ = 1
    mask = b["loss_mask"]
    micro = [(per_token[i:i + 4] * mask[i:i + 4]).sum() / mask[i:i + 4].sum() for i in (0, 4)]
    assert float(loss) == pytest.approx(float(np.mean(micro)), rel=1e-5)


def test_logprob_temperature_sets_the_trainers_scoring_temperature():
    tc = default_train_config()
    tc.loss = "grpo"
    tc.grpo.aggregation = "token_mean"
    arena = RLConfig(temperature=0.9, logprob_temperature=1.0, token_mean_micro=4)
    assert rl_train_config(arena, tc).sampling_temperature == 1.0 and arena.rescore_old_logp
    same = RLConfig(temperature=0.9)
    assert rl_train_config(same, tc).sampling_temperature == 0.9 and not same.rescore_old_logp
    greedy = RLConfig(temperature=0.0, logprob_temperature=1.0)
    assert rl_train_config(greedy, tc).sampling_temperature == 1.0 and not greedy.rescore_old_logp
    tc.grpo.aggregation = "seq_mean_token_mean"
    with pytest.raises(ValueError, match="token_mean_micro: 4 needs a group loss \\('grpo'\\) with grpo.aggregation"):
        rl_train_config(arena, tc)
    with pytest.raises(ValueError, match="logprob_temperature and token_mean_micro must be >= 0"):
        RLConfig(logprob_temperature=-1.0).validate()


def test_old_logprobs_follow_the_scoring_temperature():
    """One GRPO update per step: the sampler's log-probs (at 0.9) are dropped, the loss then takes the current ones
    (stopped): TRL's ratio of 1. Several updates: every sub-batch is rescored by the current policy, masked."""
    def batches():
        b = {"tokens": np.ones((2, 4), np.int32), "positions": np.zeros((2, 4), np.int32),
             "segment_ids": np.ones((2, 4), np.int32), "loss_mask": np.array([[0, 1, 1, 0], [0, 0, 1, 1]], np.float32),
             "old_logp": np.full((2, 4), -9.0, np.float32)}
        return [[b]]

    one = batches()
    rescore_old_logp(one, RLConfig(temperature=0.9, logprob_temperature=1.0), "groups", score=None)
    assert "old_logp" not in one[0][0]
    two = batches()
    rescore_old_logp(two, RLConfig(temperature=0.9, logprob_temperature=1.0, inner_steps=2), "groups",
                     score=lambda b: (np.full(b["tokens"].shape, -0.5), None))
    np.testing.assert_array_equal(two[0][0]["old_logp"], -0.5 * two[0][0]["loss_mask"])


def test_arena_trainer_settings_train_on_rows_not_the_prefix_tree():
    """The tree layout has no per-micro-batch token mean and no rescoring of old log-probs: "auto" keeps such a
    config on rows, an explicit "tree" is refused naming why."""
    tc = default_train_config()
    tc.loss = "grpo"
    tc.grpo.aggregation = "token_mean"
    with pytest.raises(ValueError, match="train_layout: 'tree' cannot train with token_mean_micro"):
        rl_train_config(RLConfig(temperature=0.9, logprob_temperature=1.0, token_mean_micro=4, train_layout="tree"), tc)
    with pytest.raises(ValueError, match="train_layout: 'tree' cannot train with old log-probs rescored"):
        rl_train_config(RLConfig(temperature=0.9, logprob_temperature=1.0, inner_steps=2, train_layout="tree"), tc)
    assert rl_train_config(RLConfig(temperature=0.9, logprob_temperature=1.0, train_layout="tree"), tc)  # 1 update
    rc = RLConfig(temperature=0.9, logprob_temperature=1.0, token_mean_micro=4)
    info = {}
    assert choose_layout([], rc, tc, (16,), 0, 1, object(), info) == ("rows", None) and info["layout/tree"] == 0.0
