"""train_rl end to end in the tiny world: GRPO raises the reward with the sampler on the trainer's live params, and
the first RL step's loss / advantages equal the values computed by hand from the logged episodes."""

import dataclasses

import numpy as np
import pytest
from rl_world import QUESTIONS, world

from jaxrag.env.mdp import read_episodes
from jaxrag.sampling import extends, shared_prefix
from jaxrag.rl import RLConfig, train_rl
from jaxrag.train.learner import ConfigChanged
from jaxrag.train.metrics_log import read_metrics


def test_grpo_raises_the_reward_and_logs_the_telemetry():
    policy, retriever, agent = world(seed=1, std=0.5)
    rc = RLConfig(steps=8, questions_per_step=4, group_size=4, temperature=1.0, max_new_tokens=2, max_steps=1, k=1,
                  seed=1)
    tc = {"loss": "grpo", "seq_buckets": (64, 256), "optimizer": {"lr": 1e-2}, "progress": False,
          "grpo": {"beta": 0.0}}
    res = train_rl(policy, retriever, agent, QUESTIONS, "test_ascii", rc, tc)
    r = [m["reward/mean"] for m in res.history]
    assert len(r) == 8 and res.step == 8
    # share of printable-ASCII tokens: ~0.5 for the random model, close to 1 after 8 updates
    assert np.mean(r[-3:]) > np.mean(r[:2]) + 0.3 and r[-1] > 0.8, r
    assert policy.params is res.params  # the sampler holds the trainer's own (updated) arrays
    m = res.history[0]
    for key in ("loss", "kl/k1", "kl/k2", "kl/k3", "grad_norm", "grad_max_abs/layer_00", "clip_fraction", "lr",
                "reward/std", "reward/ascii", "episode/response_tokens", "episode/searches", "episode/invalid_rate",
                "episodes_per_s", "trained_tokens_per_s", "time/sampling_s", "time/retrieval_s", "time/training_s",
                "time/reward_s"):
        assert key in m and np.isfinite(m[key]), key
    assert m["episode/response_tokens"] <= 2 and m["episode/steps"] == 1.0 and m["episode/searches"] <= 1.0
    assert m["episodes_per_s"] > 0 and m["time/training_s"] > 0


@pytest.mark.parametrize("continuous", [False, True])
def test_first_step_loss_and_advantages_match_hand_values(tmp_path, continuous):
    """token_mean, β > 0, ratio 1 and KL 0 on the first inner step: loss = -Σ_e A_e n_e / Σ_e n_e, with A_e the
    group-normalized reward and n_e the generated tokens of episode e over all its actions (rows split into two
    length groups whose partial losses add up). continuous: the episodes sampled through the policy's slot pool
    with KV sessions (rl.continuous, pool_sessions): the sampler's log-probs are still the trainer's (ratio 1)."""
    policy, retriever, agent = world(seed=2)
    policy.pool_sessions = continuous
    rc = RLConfig(steps=1, questions_per_step=2, group_size=3, inner_steps=2, temperature=0.7, max_new_tokens=6,
                  max_steps=2, k=1, seed=3, length_groups=True, continuous=continuous, train_layout="rows")
    tc = {"loss": "grpo", "seq_buckets": (64, 256), "optimizer": {"lr": 1e-2}, "progress": False,
          "grpo": {"beta": 0.04, "aggregation": "token_mean"}, "checkpoint": {"async_save": False}}
    res = train_rl(policy, retriever, agent, QUESTIONS, "test_ascii", rc, tc, tmp_path)
    eps = read_episodes(tmp_path / "episodes.jsonl")
    assert len(eps) == 6 and [e.qid for e in eps][::3] == [e.qid for e in eps][1::3]  # 2 groups of 3
    assert any(len(e.steps) == 2 for e in eps)  # multi-turn
    r = np.array([e.reward for e in eps]).reshape(2, 3)
    adv = ((r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-4)).ravel()
    n = np.array([sum(len(s.token_ids) for s in e.steps) for e in eps])
    m = read_metrics(tmp_path / "metrics.jsonl")[1]
    assert m["loss"] == res.history[0]["loss"] and m["tokens"] == 2 * m["row_tokens"]  # 2 inner steps
    np.testing.assert_allclose(m["loss"], -np.sum(adv * n) / n.sum(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(m["adv/abs_mean"], np.mean(np.abs(adv)), rtol=1e-5)
    np.testing.assert_allclose(m["reward/mean"], r.mean(), rtol=1e-6)
    assert m["row_tokens"] == n.sum() and m["rows"] == sum(len(e.steps) for e in eps)
    assert m["sub_batches"] == 2  # first actions (short prompts) and second ones (docs) in their own buckets
    assert m["kl/k2"] < 1e-9 and m["ratio_max_dev"] < 1e-3
    assert m["last_inner/ratio_max_dev"] > 1e-3  # the second inner step sees the first one's update
    assert (tmp_path / "checkpoints" / "1").is_dir()
    if continuous:   # every action went through the pool; a group's 3 identical first prompts shared one prefill
        st = policy.pool_stats
        assert st["finished"] == m["rows"] and st["prefill_shared"] == 2 * 2 and st["fallback_new"] == 6
        # EchoAgent's second prompt is not its first + the completion (it renders the parsed action): a second turn
        # keeps the common prefix of the two (sessions.shared_prefix) and prefills the rest
        ids = lambda step: policy.encode_prompt(step.prompt, rc.max_new_tokens)   # episodes.jsonl keeps no ids
        turns = [(ids(a) + a.token_ids, ids(b)) for e in eps for a, b in zip(e.steps, e.steps[1:])]
        common = [shared_prefix(held, nxt) for held, nxt in turns]
        assert len(common) == m["rows"] - 6 and not any(extends(held, nxt) for held, nxt in turns)
        assert st["reused"] == st["reused_partial"] == sum(c > 0 for c in common) > 0
        assert st["fallback_not_prefix"] == len(common) - st["reused"] and st["reused_tokens"] == sum(common)
    # the checkpoint resumes only under its own settings: another beta or group size is refused, naming the keys
    changed = {**tc, "grpo": {"beta": 0.1, "aggregation": "token_mean"}}
    with pytest.raises(ConfigChanged, match=r"rl.group_size, train.batch_size, train.grpo.beta, train.grpo.group_size"):
        train_rl(policy, retriever, agent, QUESTIONS, "test_ascii", dataclasses.replace(rc, group_size=2), changed,
                 tmp_path)


def test_rows_that_cannot_fit_the_buckets_fail_before_any_compute():
    policy, retriever, agent = world()
    rc = RLConfig(steps=1, questions_per_step=1, group_size=2, max_new_tokens=8)
    with pytest.raises(ValueError, match=r"seq_buckets: the largest bucket 128 is shorter than the longest possible "
                                         r"row, 248 prompt tokens \+ 8 new"):
        train_rl(policy, retriever, agent, QUESTIONS, "em", rc, {"loss": "grpo", "seq_buckets": (128,)})


def test_restore_step_resumes_rl_from_an_older_checkpoint_as_fit_does(tmp_path):
    """train.checkpoint.restore_step (the one trainer's resume): a run of 4 steps, then a rerun from step 2 moves
    step 4 aside and retrains steps 3-4 to the same losses and params as the first run."""
    import jax

    rc = RLConfig(steps=4, questions_per_step=2, group_size=2, temperature=1.0, max_new_tokens=2, max_steps=1, k=1,
                  seed=3)

    def tc(**ck):
        return {"loss": "grpo", "seq_buckets": (256,), "optimizer": {"lr": 1e-2}, "progress": False,
                "checkpoint": {"every_steps": 2, "keep": 3, "async_save": False, **ck}}

    policy, retriever, agent = world(seed=2)
    first = train_rl(policy, retriever, agent, QUESTIONS, "test_ascii", rc, tc(), tmp_path)
    policy, retriever, agent = world(seed=2)
    again = train_rl(policy, retriever, agent, QUESTIONS, "test_ascii", rc, tc(restore_step=2), tmp_path)
    assert [m["loss"] for m in again.history] == [m["loss"] for m in first.history[2:]]
    for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(first.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert (tmp_path / "checkpoints" / "4.set_aside").is_dir()
    with pytest.raises(FileNotFoundError, match="restore_step=3: no such checkpoint"):
        train_rl(*world(seed=2), QUESTIONS, "test_ascii", rc, tc(restore_step=3), tmp_path)


def test_every_engine_setting_has_one_owner_in_an_rl_run():
    """Each RolloutConfig field is RL's own (passed on under its name), set by rollout_config from RL's settings,
    or left at the engine's default: a new engine field fails here until it is given one of the three."""
    from jaxrag.env.rollout import RolloutConfig
    from jaxrag.rl.config import ROLLOUT_DEFAULTS, ROLLOUT_DERIVED, ROLLOUT_FIELDS, rollout_seed

    engine = [f.name for f in dataclasses.fields(RolloutConfig)]
    owned = list(ROLLOUT_FIELDS) + list(ROLLOUT_DERIVED) + list(ROLLOUT_DEFAULTS)
    assert sorted(owned) == sorted(engine) and len(set(owned)) == len(owned)
    assert set(ROLLOUT_FIELDS) <= {f.name for f in dataclasses.fields(RLConfig)}
    rc = RLConfig(temperature=0.7, max_new_tokens=9, max_steps=3, k=4, max_invalid=2, continuous=True,
                  summary_max_new_tokens=11, seed=5)
    got = rc.rollout_config(step=3, n_episodes=16)
    want = RolloutConfig(k=4, max_steps=3, batch_size=16, n_candidates=1, temperature=0.7, max_new_tokens=9,
                         summary_max_new_tokens=11, max_invalid=2, seed=rollout_seed(5, 3), continuous=True,
                         episode_reward=False)
    assert got == want and dataclasses.replace(rc, rollout_batch=4).rollout_config(3, 16).batch_size == 4
