"""train_rl(): online multi-turn GRPO / PPO over a live retriever (the host loop around the jitted train step).

    result = train_rl(policy, retriever, agent, questions, "em", RLConfig(...), {"loss": "grpo", ...}, workdir)

Each RL step t (1-based):
1. questions: B of them, batch t-1 of a deterministic stream (epoch permutations of (seed, epoch)), so a resumed
   run sees the same questions;
2. sampling: the step's groups by rc.group_rollout (jaxrag.rl.group_rollout): "independent" passes each question G
   times to `jaxrag.env.rollout.rollout` (one sample per row), "smartsearch_refine" expands initial trajectories by
   query refinement (SmartSearch stage 3) until G; both multi-turn, live retriever, temperature rc.temperature,
   sampling keys from (seed, t), batched over the step's questions, with the CURRENT params: after every update
   the JaxPolicy gets the trainer's own arrays (full fine-tune) or base + adapters merged (LoRA, sync/lora_merge);
   the assignment refreshes its per-layer decode copy (JaxPolicy.params; time/sync_s) — never a stale copy;
3. rewards: the named reward function (jaxrag.supervision.rewards.reward_fn) per episode, total + components;
4. rows (jaxrag.rl.rows): one row per generated action from exactly the ids the sampler saw (GRPO, rc.merge_turns:
   an episode's consecutive actions share one row wherever the ids continue), in the layout rc.train_layout picks
   (jaxrag.train.prefix_tree: padded rows, or the rows as a prefix tree; logged: layout/tree,
   layout/tree_flops_ratio, update_tokens, distinct_tokens); GRPO: group-normalized
   advantages per question + aggregation weights; PPO: the value head scores the rows, GAE along each trajectory;
5. `inner_steps` epochs of `minibatches` optimizer steps on those rows (each minibatch = whole groups; the trainer's
   jitted step: jaxrag.train.steps, with gradient accumulation; with rc.length_groups the rows of one update are
   split by sequence bucket, their gradients summed before one optimizer update); old log-probs stay the sampler's
   (a refined query of the smartsearch_refine rollout, which no sampler produced: the current policy's own);
6. telemetry (JSONL + TensorBoard + tqdm) and, every train.checkpoint.every_steps RL steps, an orbax checkpoint of
   params, optimizer, optimizer-step counter and PRNG; its meta holds the RL step = the question-stream position.

Logged per RL step (metrics.jsonl): the trainer's metrics of the FIRST inner step (loss, kl/k1..k3 against the
reference, clip_fraction, ratio_max_dev, grad_norm, grad_max_abs/layer_*, lr) and, with several updates per step,
the last update's loss / clip_fraction / ratio_max_dev under last_inner/; reward/mean, reward/std, reward/<component>;
episode/* (response tokens, searches, steps, invalid-action rate, truncations); time/* (sampling = generation +
summaries, retrieval, reward = the reward function's, an answer judge's calls included, scoring, training, host) and
throughput (episodes_per_s, trained_tokens_per_s).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jaxrag.env.mdp import INVALID, Episode, write_episodes
from jaxrag.env.rollout import RolloutConfig
from jaxrag.rl import rows as R
from jaxrag.rl.config import RLConfig, rl_layout, rl_train_config, tree_unsupported
from jaxrag.rl.group_rollout import GroupSampler, sample_groups
from jaxrag.supervision.rewards import Reward, prepare, reward_fn
from jaxrag.train.batching import BatchStream
from jaxrag.train import prefix_tree as PT
from jaxrag.train.distributed import allgather_objects, gather_shares, process_count, process_index, share, to_local
from jaxrag.train.learner import RESUMABLE as RESUMABLE_TRAIN
from jaxrag.train.learner import Learner


@dataclasses.dataclass
class RLResult:
    params: Any  # the trained policy params (LoRA merged)
    adapters: Any  # LoRA adapters or None
    head: Any  # PPO value head or None
    step: int  # RL steps done
    metrics: dict  # the last RL step's metrics
    history: list[dict]  # every RL step's metrics run in this call


def question_stream(questions: Sequence, rc: RLConfig) -> BatchStream:
    """Batch t of B questions depends only on (seed, t): resumable by position."""
    return BatchStream(list(questions), rc.questions_per_step, lambda qs: qs, seed=rc.seed, shuffle=rc.shuffle)


def score_episodes(episodes: Sequence[Episode], reward) -> list[Reward]:
    """The reward of every episode; ep.reward and ep.metadata["reward_components"] are set from it. A reward with a
    `prepare` (a judged reward) first sees the whole batch."""
    prepare(reward, episodes)
    out = []
    for ep in episodes:
        r = reward(ep)
        ep.reward = float(r.total)
        ep.metadata["reward_components"] = {k: float(v) for k, v in r.components.items()}
        out.append(r)
    return out


SEED_STRIDE = 1_000_003  # multi-host: process p samples its groups with seed + p * SEED_STRIDE (its own row keys)


def sample_and_score(sampler, questions: Sequence, rc: RLConfig, rcfg: RolloutConfig, reward, stats: dict,
                     step_rewards=None) -> tuple[list[Episode], list[Reward], float, list | None]:
    """The step's episodes (B contiguous groups of G), their rewards, the reward seconds and, with `step_rewards`
    (PPO's process rewards, e.g. a PRM: episodes -> per-step rewards), each episode's step rewards (else None). On
    several processes each samples, retrieves and scores (rewards and step rewards) its contiguous share of the
    questions (whole groups: advantages stay within a group) with its own sampler, at seed + p * SEED_STRIDE; the
    episodes and their scores are gathered in question order on every process, so each builds the same global
    batch as one process would (the update is then split over the mesh by sharding.shard_batch); `stats` gets the
    slowest process's seconds."""
    def score(episodes):
        t0 = time.perf_counter()
        rewards = score_episodes(episodes, reward)  # a judged reward's LLM calls happen here
        steps = step_rewards(episodes) if step_rewards is not None and episodes else []
        return rewards, steps, time.perf_counter() - t0

    if process_count() == 1:
        episodes = sample_groups(sampler, questions, rc, rcfg, stats)
        rewards, steps, reward_s = score(episodes)
        return episodes, rewards, reward_s, steps if step_rewards is not None else None
    mine = share(list(questions))
    local: dict = {}
    episodes, rewards, steps, reward_s = [], [], [], 0.0
    if mine:
        rcfg = dataclasses.replace(rcfg, seed=rcfg.seed + process_index() * SEED_STRIDE,
                                   batch_size=rc.rollout_batch or len(mine) * rc.group_size)
        episodes = sample_groups(sampler, mine, rc, rcfg, local)
        rewards, steps, reward_s = score(episodes)
    for part in allgather_objects({**{k: v for k, v in local.items() if isinstance(v, (int, float))},
                                   "reward_s": reward_s}):
        for k, v in part.items():  # side by side: seconds are the slowest process's, counts add up
            stats[k] = max(stats.get(k, 0.0), v) if k.endswith("_s") else stats.get(k, 0) + v
    for k in ("generate_s", "summarize_s", "retrieve_s", "total_s"):
        stats.setdefault(k, 0.0)
    return (gather_shares(episodes), gather_shares(rewards), stats.pop("reward_s"),
            gather_shares(steps) if step_rewards is not None else None)


def episode_stats(episodes: Sequence[Episode], rewards: Sequence[Reward], group_size: int) -> dict:
    tot = np.asarray([r.total for r in rewards], np.float64)
    m = {"reward/mean": float(tot.mean()), "reward/std": float(tot.std())}
    for name in sorted({k for r in rewards for k in r.components}):
        m[f"reward/{name}"] = float(np.mean([r.components.get(name, 0.0) for r in rewards]))
    groups = tot.reshape(-1, group_size)
    m["reward/groups_without_signal"] = float(np.mean(groups.max(1) == groups.min(1)))
    steps = [st for ep in episodes for st in ep.steps]
    m["episode/response_tokens"] = float(np.mean([sum(len(s.token_ids) for s in ep.steps) for ep in episodes]))
    m["episode/action_tokens"] = float(np.mean([len(s.token_ids) for s in steps if s.token_ids] or [0]))
    m["episode/searches"] = float(np.mean([ep.num_searches for ep in episodes]))
    m["episode/steps"] = float(np.mean([len(ep.steps) for ep in episodes]))
    m["episode/invalid_rate"] = float(np.mean([s.action.kind == INVALID for s in steps])) if steps else 0.0
    m["episode/answered"] = float(np.mean([ep.answer is not None for ep in episodes]))
    m["episode/truncated"] = float(np.mean([s.finish_reason == "length" for s in steps if s.token_ids] or [0]))
    return m


def build_batch(episodes: Sequence[Episode], rewards: Sequence[Reward], rc: RLConfig, tc, pad_id: int,
                row_multiple: int, score=None, step_rewards: list | None = None, mcfg=None) -> tuple[list[dict], dict]:
    """The host batches of one update over whole groups (one per length group, or one prefix-tree batch) + info.
    `score(batch) -> (logp, values)`: PPO's old values; step_rewards[e][s]: PPO per-step rewards (None: the outcome
    at the last token); mcfg: the model config the layout's cost model weighs (rc.train_layout; None = rows)."""
    rows = R.action_rows(episodes)
    buckets = tuple(tc.seq_buckets)
    info = {"rows": len(rows)}
    groups = rl_layout(tc) == "groups"
    if groups and rc.merge_turns:
        rows = R.merge_turns(rows)
        info["rows_merged"] = len(rows)
    layout, tree = choose_layout(rows, rc, tc, buckets, pad_id, row_multiple, mcfg, info)
    if groups:
        adv = R.group_advantages(episodes, [r.total for r in rewards], rc.group_size, tc.grpo.adv_eps,
                                 tc.grpo.std_ddof)
        if layout == "tree":
            batches = [R.grpo_tree_batch(rows, adv, tc.grpo.aggregation, rc.token_budget, tree)]
        else:
            batches = R.grpo_batches(rows, adv, tc.grpo.aggregation, rc.token_budget, buckets, pad_id, row_multiple,
                                     rc.length_groups, micro=rc.token_mean_micro)
        info["adv/abs_mean"] = float(np.mean(np.abs(adv)))
    else:
        R.check_groups(episodes, rc.group_size)
        if layout == "tree":
            t0 = time.perf_counter()
            values = np.asarray(score({k: v for k, v in tree.arrays().items() if k != "loss_mask"})[1])
            info["time/scoring_s"] = time.perf_counter() - t0
            batches = [R.ppo_tree_batch(rows, tree, values, [r.total for r in rewards], step_rewards, tc.ppo.gamma,
                                        tc.ppo.lam, tc.ppo.whiten)]
        else:
            groups = R.length_groups(rows, buckets, rc.length_groups)
            packed = [R.pack([rows[i] for i in idx], buckets, pad_id, row_multiple) for idx in groups]
            t0 = time.perf_counter()
            values = [np.asarray(score({k: p[k] for k in ("tokens", "positions", "segment_ids")})[1]) for p in packed]
            info["time/scoring_s"] = time.perf_counter() - t0
            batches = R.ppo_batches(rows, groups, packed, values, [r.total for r in rewards], step_rewards,
                                    tc.ppo.gamma, tc.ppo.lam, tc.ppo.whiten)
    info["row_tokens"] = int(sum(b["loss_mask"].sum() for b in batches))
    info["batch_fill"] = float(sum((b["segment_ids"] > 0).sum() for b in batches) /
                               sum(b["segment_ids"].size for b in batches))
    info["update_tokens"] = int(sum(b["segment_ids"].size for b in batches))
    info["sub_batches"] = len(batches)
    return batches, info


def choose_layout(rows, rc: RLConfig, tc, buckets, pad_id: int, row_multiple: int, mcfg,
                  info: dict) -> tuple[str, object]:
    """(layout, prefix tree or None) for rc.train_layout (jaxrag.train.prefix_tree.choose_layout: "auto" weighs
    the rows' and the tree's work for this model); info gains layout/tree (1 = tree), distinct_tokens (the
    step's tokens with every shared prefix counted once) and layout/tree_flops_ratio."""
    info["distinct_tokens"] = PT.distinct_tokens([r.prompt + r.completion for r in rows])
    mode = rc.train_layout if mcfg is not None else "rows"
    if tree_unsupported(rc, tc):
        mode = "rows"   # RLConfig.validate refuses an explicit "tree" here
    tree = None
    if mode != "rows":
        tree = R.row_tree(rows, buckets, mcfg, pad_id, row_multiple)
        shapes = R.rows_shapes(rows, buckets, row_multiple, rc.length_groups and rl_layout(tc) == "groups")
        rw, tw = PT.rows_work(shapes), PT.tree_work(tree)
        info["layout/tree_flops_ratio"] = tw.flops(mcfg) / max(rw.flops(mcfg), 1.0)
        mode = PT.choose_layout(mode, rw, tw, mcfg)[0]
    info["layout/tree"] = float(mode == "tree")
    return mode, (tree if mode == "tree" else None)


def build_batches(episodes: Sequence[Episode], rewards: Sequence[Reward], rc: RLConfig, tc, pad_id: int,
                  row_multiple: int, score=None, step_rewards: list | None = None,
                  mcfg=None) -> tuple[list[list[dict]], dict]:
    """The sub-batches of every minibatch (contiguous whole groups), all built (and, PPO, scored) before any update."""
    n = len(episodes) // rc.minibatches
    updates, infos = [], []
    for i in range(rc.minibatches):
        sl = slice(i * n, (i + 1) * n)
        sub = step_rewards[sl] if step_rewards is not None else None
        b, info = build_batch(episodes[sl], rewards[sl], rc, tc, pad_id, row_multiple, score, sub, mcfg)
        updates.append(b)
        infos.append(info)
    info = {k: float(np.sum([x[k] for x in infos])) for k in ("rows", "rows_merged", "row_tokens", "time/scoring_s",
                                                                "sub_batches", "update_tokens", "distinct_tokens")
            if k in infos[0]}
    info.update({k: float(np.mean([x[k] for x in infos])) for k in ("batch_fill", "adv/abs_mean", "layout/tree",
                                                                     "layout/tree_flops_ratio") if k in infos[0]})
    return updates, info


def rescore_old_logp(batches: list[list[dict]], rc: RLConfig, layout: str, score) -> None:
    """rc.rescore_old_logp: the old log-probs at the trainer's scoring temperature, before the step's first update.
    layout: the loss's (rl_layout). One group-loss (GRPO) update per step: none needed (the loss takes the current log-probs, stopped: a ratio of exactly 1, as
    TRL does with one iteration); else the current policy scores every sub-batch (`score(batch) -> (logp, _)`)."""
    for subs in batches:
        for b in subs:
            if layout == "groups" and rc.updates_per_step == 1:
                b.pop("old_logp", None)
            else:
                b["old_logp"] = (np.asarray(score(b)[0], np.float32) * b["loss_mask"]).astype(np.float32)


RESUMABLE = tuple(f"train.{k}" for k in RESUMABLE_TRAIN) + ("rl.steps", "rl.save_episodes")


def check_row_budget(policy, rc: RLConfig, tc) -> None:
    """The longest row the sampler can produce (prompt limit + max_new_tokens) must fit the largest sequence bucket:
    fail before any compute, not at the first long prompt."""
    limit = policy.prompt_budget(rc.max_new_tokens)
    longest = limit + rc.max_new_tokens
    if longest > max(tc.seq_buckets):
        raise ValueError(f"train config: seq_buckets: the largest bucket {max(tc.seq_buckets)} is shorter than the "
                         f"longest possible row, {limit} prompt tokens + {rc.max_new_tokens} new: add a bucket of "
                         f"{longest} or limit the prompt (policy.max_prompt_tokens)")


def step_metrics(step: int, rc: RLConfig, inner: list[dict], episodes, rewards, info: dict, stats: dict,
                 times: dict, sync: str) -> dict:
    """One RL step's metrics row: the first update's (and the last inner update's loss, clip fraction and ratio
    deviation), the episodes' rewards and shapes, the rows' info, the rollout's counts and every phase's seconds."""
    metrics = dict(inner[0])
    if len(inner) > 1:
        metrics.update({f"last_inner/{k}": inner[-1][k] for k in ("loss", "clip_fraction", "ratio_max_dev")})
    metrics.update(episode_stats(episodes, rewards, rc.group_size))
    metrics.update(info)
    if "judge_s" in stats:
        metrics["time/judge_s"] = stats["judge_s"]
    if rc.group_rollout != "independent":
        metrics.update({"time/judge_s": stats.get("judge_s", 0.0),
                        **{f"refine/{k}": float(stats.get(k, 0)) for k in (
                            "refine_rounds", "refine_requests", "refine_failures", "refined_episodes")}})
    metrics.update({
        "time/sampling_s": stats["generate_s"] + stats["summarize_s"], "time/retrieval_s": stats["retrieve_s"],
        **times, "episodes_per_s": len(episodes) / max(stats["total_s"], 1e-9),
        "trained_tokens_per_s": info["row_tokens"] * rc.inner_steps / max(times["time/training_s"], 1e-9),
        "optimizer_step": step * rc.updates_per_step, "sync/lora_merge": float(sync == "lora_merge"),
    })
    return metrics


def save_step_episodes(path: Path, episodes, step: int) -> None:
    """Append a step's episodes to episodes.jsonl, each marked with its RL step; prompt ids are dropped (they are
    reproducible from the prompt text) to keep the file small."""
    for ep in episodes:
        ep.metadata["rl_step"] = step
        for st in ep.steps:
            st.prompt_ids = []
    write_episodes(path, episodes, append=True)


def train_rl(
    policy,
    retriever,
    agent,
    questions: Sequence,
    reward: str | Callable,
    rc: RLConfig,
    train_config=None,
    workdir: str | Path | None = None,
    *,
    step_rewards: Callable[[Sequence[Episode]], list[list[float]]] | None = None,
    summarizer=None,
    judge=None,
    refiner=None,
    mesh=None,
    resume: bool = True,
    progress: bool | None = None,
) -> RLResult:
    """Online RL of `policy` (a JaxPolicy: cfg, params, tokenizer) on `questions` (QAExample or dicts).

    Args:
      policy: the JaxPolicy to train; its params are replaced by the trainer's after every update.
      retriever: the live retriever the episodes search.
      agent: the jaxrag.env.agents Agent that renders prompts and parses actions.
      questions: the training questions (QAExample or dicts).
      reward: a spec for jaxrag.supervision.rewards.reward_fn ("em", "arena", {"em": 1, "f1": 0.5}) or a function
        Episode -> Reward.
      rc: the RLConfig (steps, group size, rollout, layout, ...).
      train_config: the trainer's config (loss "grpo" | "ppo"; see rl_train_config for the keys the RL loop sets).
      workdir: checkpoints/, metrics.jsonl, tb/, train_config.json, rl_settings.json, episodes.jsonl; None = no
        files, no resume. A checkpoint resumes only under its own settings (train.learner.Learner.open).
      step_rewards: (PPO) episodes -> per-step rewards (e.g. a PRM), placed at each action's last token instead
        of the outcome at the last one.
      summarizer: the policy of summary generations (default: policy).
      judge: (rc.group_rollout "smartsearch_refine") the optional usefulness judge, a
        jaxrag.supervision.judge_protocol Judge.
      refiner: (rc.group_rollout "smartsearch_refine") the required query refiner, a judge_protocol Judge.
      mesh: optional device mesh; None = built from the train config.
      resume: resume from workdir's latest checkpoint if there is one.
      progress: show a progress bar; None = the train config's `progress`.

    Returns:
      RLResult: the trained params, adapters, PPO value head, RL steps done, the last step's metrics and the
      metrics of every RL step run in this call.

    Raises:
      ValueError: if the RL or train config is invalid, a row can exceed the largest seq bucket, a
        non-"independent" group_rollout runs on several processes, or a resumed checkpoint's settings differ.
    """
    rc.validate()
    tc = rl_train_config(rc, train_config)
    if process_count() > 1 and rc.group_rollout != "independent":
        raise ValueError(f"rl.group_rollout={rc.group_rollout!r} runs on one process only (its query scorer is the "
                         "trainer's sharded step); use group_rollout 'independent' or one process")
    check_row_budget(policy, rc, tc)
    if hasattr(reward, "to_dict"):  # a ConfigDict of weights
        reward = reward.to_dict()
    score_reward = reward if callable(reward) else reward_fn(reward)
    lr = Learner(policy.cfg, policy.params, tc, mesh=mesh)
    policy.cfg = lr.mcfg  # the sampler computes in train.compute_dtype, as the trainer does
    row_multiple = lr.mesh.shape["data"] * lr.mesh.shape["fsdp"] * int(tc.grad_accum)
    pad_id = policy.cfg.pad_id if policy.cfg.pad_id is not None else 0

    def score_completions(pairs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        """The current policy's log-probs (train.sampling_temperature) of each completion after its prompt."""
        rows = [R.Row(i, 0, p, c, [0.0] * len(c)) for i, (p, c) in enumerate(pairs)]
        b = R.pack(rows, tuple(tc.seq_buckets), pad_id, row_multiple)
        logp = np.asarray(lr.score({k: b[k] for k in ("tokens", "positions", "segment_ids")})[0])
        return [logp[i, len(p):len(p) + len(c)].tolist() for i, (p, c) in enumerate(pairs)]

    sampler = GroupSampler(policy, retriever, agent, summarizer=summarizer, judge=judge, refiner=refiner,
                           encode=lambda prompt: policy.encode_prompt(prompt, rc.max_new_tokens),
                           tokenize=lambda text: policy.tokenizer.encode(text), score=score_completions)
    start = lr.open(workdir, rc.steps, resume=resume, settings={"train": tc.to_dict(), "rl": dataclasses.asdict(rc)},
                    settings_file="rl_settings.json", ignore=RESUMABLE,
                    progress=tc.progress if progress is None else progress)
    workdir = Path(workdir) if workdir is not None else None
    stream = question_stream(questions, rc)
    history: list[dict] = []
    last: dict = {}
    step = start
    seen_shapes: set = set()
    try:
        lr.arm()
        policy.params = to_local(lr.params)
        for step in range(start + 1, rc.steps + 1):
            t_step = time.perf_counter()
            questions_t = stream.batch_at(step - 1)
            rcfg = rc.rollout_config(step, len(questions_t) * rc.group_size)
            stats: dict = {}
            episodes, rewards, reward_s, steps_r = sample_and_score(sampler, questions_t, rc, rcfg, score_reward,
                                                                    stats, step_rewards)
            t_host = time.perf_counter()
            batches, info = build_batches(episodes, rewards, rc, tc, pad_id, row_multiple, step_rewards=steps_r,
                                          score=lr.score, mcfg=lr.mcfg)
            if rc.rescore_old_logp:
                rescore_old_logp(batches, rc, rl_layout(tc), lambda b, st=lr.state: lr.score(
                    {k: b[k] for k in ("tokens", "positions", "segment_ids")}, st))
            host_s = time.perf_counter() - t_host - info.get("time/scoring_s", 0.0)
            shapes = {(len(subs) > 1, tuple(sorted((k, np.shape(v)) for k, v in b.items())))
                      for subs in batches for b in subs}
            info["train/new_shapes"] = len(shapes - seen_shapes)  # each one compiles the train step once (a prefix
            # tree's batch shape is its packs, its length and its read slots)
            seen_shapes |= shapes

            t_train = time.perf_counter()
            inner = [lr.update(subs) for _ in range(rc.inner_steps) for subs in batches]   # blocks per update
            train_s = time.perf_counter() - t_train
            t_sync = time.perf_counter()
            params_now, sync = lr.policy_params()
            policy.params = to_local(params_now)  # multi-host: each process's sampler holds the weights whole
            sync_s = time.perf_counter() - t_sync

            times = {"time/training_s": train_s, "time/reward_s": reward_s,
                     "time/host_s": host_s + stats.get("host_s", 0.0), "time/step_s": time.perf_counter() - t_step,
                     "time/sync_s": sync_s}
            metrics = step_metrics(step, rc, inner, episodes, rewards, info, stats, times, sync)
            lr.check_finite([x["loss"] for x in inner], f"RL step {step}")
            last = metrics
            history.append(metrics)
            lr.write(step, metrics, int(info["row_tokens"]) * rc.inner_steps)
            if workdir is not None and rc.save_episodes and jax.process_index() == 0:
                save_step_episodes(workdir / "episodes.jsonl", episodes, step)
            lr.end_step(step, rc.steps, {"optimizer_step": step * rc.updates_per_step, "loss": metrics["loss"]})
        else:
            step = rc.steps
    finally:
        lr.close()
    return RLResult(params=lr.params, adapters=lr.adapters, head=lr.head, step=step, metrics=last, history=history)
