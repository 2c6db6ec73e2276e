"""Episodes -> RL token rows: masks, group checks, advantages, aggregation weights and trajectory GAE by hand."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrag import losses
from jaxrag.env.mdp import Action, Episode, Step
from jaxrag.rl import rows as R


def step(prompt, gen, kind="query", logp=None):
    return Step(action=Action(kind, "x"), prompt_ids=list(prompt), token_ids=list(gen),
                logprobs=list(logp if logp is not None else [-0.1 * (i + 1) for i in range(len(gen))]))


def episode(qid, *steps):
    return Episode(qid=qid, question=f"question {qid}", gold=["g"], steps=list(steps))


def test_only_generated_tokens_carry_loss_and_old_logprobs():
    eps = [episode("a", step([1, 5, 6], [7, 8], logp=[-0.5, -0.25]),
                   Step(action=Action("query", "scripted")),  # a scripted first action: no generated ids, no row
                   step([1, 5, 6, 7, 8, 40, 41], [9], "answer", logp=[-2.0])),
           episode("b", step([1, 3], [4, 4, 4], "answer"))]
    rows = R.action_rows(eps)
    assert [(r.episode, r.step) for r in rows] == [(0, 0), (0, 2), (1, 0)]
    b = R.pack(rows, buckets=(8, 16), pad_id=0, row_multiple=1)
    assert b["tokens"].shape == (4, 8)  # 3 rows -> 4 (power of two); longest row 8 tokens -> bucket 8
    np.testing.assert_array_equal(b["tokens"][0], [1, 5, 6, 7, 8, 0, 0, 0])
    np.testing.assert_array_equal(b["loss_mask"][0], [0, 0, 0, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(b["loss_mask"][1], [0, 0, 0, 0, 0, 0, 0, 1])  # docs 40, 41 are prompt: masked
    np.testing.assert_array_equal(b["loss_mask"][2], [0, 0, 1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(b["loss_mask"][3], 0)  # padding row
    np.testing.assert_allclose(b["old_logp"][0], [0, 0, 0, -0.5, -0.25, 0, 0, 0])
    np.testing.assert_allclose(b["old_logp"][1, 7], -2.0)
    np.testing.assert_array_equal(b["segment_ids"][0], [1, 1, 1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(b["row_episode"], [0, 0, 1, -1])
    assert R.pack(rows, (8,), row_multiple=3)["tokens"].shape[0] == 6  # 4 rows rounded to data x accum
    assert [R.row_bucket(n, 1) for n in (1, 3, 5, 9, 11, 17, 23, 25, 33, 100)] == [1, 4, 8, 10, 12, 20, 24, 28, 40, 112]
    assert R.row_bucket(9, 4) == 12


def test_rows_need_the_sampled_prompt_ids():
    bad = episode("a", Step(action=Action("answer", "x"), token_ids=[3, 4], logprobs=[-1.0, -1.0]))
    with pytest.raises(ValueError, match=r"episode 0 \(question 'a'\) step 0: generated ids without prompt ids"):
        R.action_rows([bad])
    short = episode("a", step([1], [3, 4], logp=[-1.0]))
    with pytest.raises(ValueError, match="1 log-probs for 2 generated ids"):
        R.action_rows([short])
    with pytest.raises(ValueError, match="more than the largest bucket 4"):
        R.pack(R.action_rows([episode("a", step([1, 2, 3], [4, 5]))]), (4,))


def test_groups_must_be_exactly_group_size_episodes_of_one_question():
    a, b = episode("a", step([1], [2])), episode("b", step([1], [2]))
    assert R.check_groups([a, a, b, b], 2) == ["a", "b"]
    with pytest.raises(R.GroupError, match="3 episodes do not split into groups of group_size=2"):
        R.check_groups([a, a, b], 2)
    with pytest.raises(R.GroupError, match="group 0 .* mixes questions 'a' and 'b'"):
        R.check_groups([a, b, b, a], 2)
    with pytest.raises(R.GroupError, match="question 'a' has 4 episodes"):
        R.check_groups([a, a, a, a], 2)


def test_group_advantages_by_hand():
    eps = [episode("a", step([1], [2]))] * 3 + [episode("b", step([1], [2]))] * 3
    adv = R.group_advantages(eps, [1.0, 0.0, 0.0, 0.5, 0.5, 0.5], 3, eps=1e-4, std_ddof=1)
    std = np.std([1.0, 0.0, 0.0], ddof=1)  # 0.57735
    np.testing.assert_allclose(adv[:3], [(2 / 3) / (std + 1e-4), (-1 / 3) / (std + 1e-4), (-1 / 3) / (std + 1e-4)],
                               rtol=1e-6)
    np.testing.assert_array_equal(adv[3:], 0.0)  # a group without signal has no advantage
    # one formula: the loss's float32 jax path agrees; the host path is the float64 one, returned as float32
    r = [1, 0, 0, .5, .5, .5]
    np.testing.assert_allclose(adv, np.asarray(losses.group_advantages(jnp.asarray(r, jnp.float32), 3)), rtol=1e-5)
    assert adv.dtype == np.float32
    np.testing.assert_array_equal(adv, ((np.reshape(r, (2, 3)) - np.mean(np.reshape(r, (2, 3)), 1, keepdims=True))
                                        / (np.std(np.reshape(r, (2, 3)), 1, ddof=1, keepdims=True) + 1e-4))
                                  .reshape(-1).astype(np.float32))


def test_aggregation_weights_treat_the_trajectory_as_the_sequence():
    # episode 0: rows of 2 and 3 action tokens (|o_0| = 5); episode 1: one row of 1 token
    eps = [episode("a", step([1], [2, 3]), step([1], [4, 5, 6])), episode("a", step([1], [7], "answer"))]
    rows = R.action_rows(eps)
    np.testing.assert_allclose(R.row_weights(rows, "token_mean", 0), [1 / 6] * 3)
    np.testing.assert_allclose(R.row_weights(rows, "seq_mean_token_mean", 0), [1 / 10, 1 / 10, 1 / 2])
    np.testing.assert_allclose(R.row_weights(rows, "seq_mean_token_sum_norm", 8), [1 / 16] * 3)
    b = R.grpo_batch(rows, np.array([0.5, -0.5], np.float32), "seq_mean_token_mean", 0, (8,))
    np.testing.assert_allclose(b["advantages"], [0.5, 0.5, -0.5, 0.0])  # the episode's A on each of its rows
    np.testing.assert_allclose(b["token_weight"].sum(), 1.0, rtol=1e-6)  # (1/E) Σ_e (1/|o_e|) Σ_t 1 = 1
    np.testing.assert_allclose(b["token_weight"][0], [0, .1, .1, 0, 0, 0, 0, 0])
    assert "row_episode" not in b
    with pytest.raises(ValueError, match="is not one of"):
        R.row_weights(rows, "sum", 0)


def test_trajectory_gae_runs_across_the_rows_of_an_episode():
    # one episode, two actions: values v = [.1, .2 | .3], outcome 1 at the last token; second episode one action
    eps = [episode("a", step([1], [2, 3]), step([1], [4], "answer")), episode("b", step([1], [5, 6], "answer"))]
    rows = R.action_rows(eps)
    values = [np.array([.1, .2]), np.array([.3]), np.array([.5, .4])]
    rewards = R.token_rewards(rows, outcome=[1.0, 0.0])
    np.testing.assert_array_equal(np.concatenate(rewards), [0, 0, 1, 0, 0])
    adv, ret = R.trajectory_gae(rows, values, rewards, gamma=1.0, lam=0.5)
    # by hand, episode a: δ = [0 + .2 - .1, 0 + .3 - .2, 1 + 0 - .3] = [.1, .1, .7]; A_t = δ_t + .5 A_{t+1}
    a2 = 0.7
    a1 = 0.1 + 0.5 * a2
    a0 = 0.1 + 0.5 * a1
    np.testing.assert_allclose(np.concatenate(adv[:2]), [a0, a1, a2], rtol=1e-6)
    np.testing.assert_allclose(np.concatenate(ret[:2]), [a0 + .1, a1 + .2, a2 + .3], rtol=1e-6)
    # episode b alone equals the trainer's GAE on one row
    want, _ = losses.gae(np.array([[0, 0.0]]), np.array([[.5, .4]]), np.ones((1, 2)), 1.0, 0.5)
    np.testing.assert_allclose(adv[2], np.asarray(want)[0], rtol=1e-6)
    # step rewards (a PRM) at each action's last token instead of the outcome
    sr = R.token_rewards(rows, outcome=[1.0, 0.0], step_rewards=[[0.25, 0.75], [0.5]])
    np.testing.assert_array_equal(np.concatenate(sr), [0, .25, .75, 0, .5])


def test_ppo_batch_places_values_advantages_and_returns_on_action_tokens():
    eps = [episode("a", step([1, 9], [2, 3]), step([1, 9, 2, 3, 30], [4], "answer"))]
    rows = R.action_rows(eps)
    packed = R.pack(rows, (8,))
    old_values = np.zeros(packed["tokens"].shape, np.float32)
    old_values[0, 2:4] = [.1, .2]
    old_values[1, 5] = .3
    old_values[0, 0] = 99.0  # a prompt position: never read
    b = R.ppo_batch(rows, packed, old_values, [1.0], None, gamma=1.0, lam=1.0, whiten=False)
    np.testing.assert_allclose(b["advantages"][0, 2:4], [.9, .8], rtol=1e-6)  # λ = γ = 1: A_t = R - V_t
    np.testing.assert_allclose(b["advantages"][1, 5], .7, rtol=1e-6)
    np.testing.assert_allclose(b["returns"][0, 2:4], [1.0, 1.0], rtol=1e-6)
    assert b["old_values"][0, 0] == 0 and b["advantages"][1, :5].sum() == 0
    np.testing.assert_allclose(b["token_weight"].sum(), 1.0, rtol=1e-6)
    w = R.ppo_batch(rows, packed, old_values, [1.0], None, gamma=1.0, lam=1.0, whiten=True)
    a = np.array([.9, .8, .7])
    np.testing.assert_allclose([*w["advantages"][0, 2:4], w["advantages"][1, 5]], (a - a.mean()) / a.std(), atol=1e-5)


def test_sub_batch_metrics_combine_into_the_updates():
    from jaxrag.train.learner import combine_metrics

    parts = [({"loss": 0.25, "kl/k2": 0.1, "clip_fraction": 0.0, "ratio_max_dev": 0.5}, 30.0),
             ({"loss": -0.5, "kl/k2": 0.4, "clip_fraction": 1.0, "ratio_max_dev": 0.25}, 10.0)]
    m = combine_metrics(parts)
    assert m["loss"] == pytest.approx(-0.25)  # partial sums under whole-update weights
    assert m["kl/k2"] == pytest.approx((0.1 * 30 + 0.4 * 10) / 40)  # token means, token-weighted
    assert m["clip_fraction"] == pytest.approx(0.25) and m["ratio_max_dev"] == 0.5


def test_merge_turns_joins_actions_whose_ids_continue():
    """An episode whose next prompt continues the last row's ids token for token becomes one row (observation ids
    masked, each generated id with its own log-prob); a prompt that does not continue starts a new row."""
    a = episode("a", step([1, 5], [7, 8], logp=[-0.5, -0.25]),
                step([1, 5, 7, 8, 40, 41], [9], "query", logp=[-2.0]),
                step([1, 5, 7, 8, 40, 41, 9, 42], [10, 11], "answer", logp=[-1.0, -3.0]))
    b = episode("b", step([1, 3], [4]), step([1, 3, 6, 50], [5], "answer"))  # re-rendered: 6 != 4, no merge
    rows = R.merge_turns(R.action_rows([a, b]))
    assert [(r.episode, r.step) for r in rows] == [(0, 0), (1, 0), (1, 1)]
    m = rows[0]
    assert m.prompt == [1, 5] and m.completion == [7, 8, 40, 41, 9, 42, 10, 11]
    assert m.gen_mask == [1, 1, 0, 0, 1, 0, 1, 1] and m.generated == 5
    batch = R.pack(rows, (16,))
    np.testing.assert_array_equal(batch["loss_mask"][0, :10], [0, 0, 1, 1, 0, 0, 1, 0, 1, 1])
    np.testing.assert_allclose(batch["old_logp"][0, :10], [0, 0, -0.5, -0.25, 0, 0, -2.0, 0, -1.0, -3.0])
    # the weights count generated ids only: the same as without merging
    unmerged = R.action_rows([a, b])
    for agg in ("token_mean", "seq_mean_token_mean"):
        w_m = R.grpo_batch(rows, np.ones(2, np.float32), agg, 16, (16,))["token_weight"]
        w_u = R.grpo_batch(unmerged, np.ones(2, np.float32), agg, 16, (16,))["token_weight"]
        assert w_m.sum() == pytest.approx(w_u.sum()) == pytest.approx(1.0)
