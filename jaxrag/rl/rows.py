"""Finished episodes -> the token rows, advantages and aggregation weights of one RL update (host side, numpy).

Rows (the exact choice for multi-turn episodes): one row per generated action; for GRPO, `merge_turns` joins an
episode's consecutive actions into one row wherever the next prompt's ids continue the row's ids token for token
(observations between turns masked), the same objective with each prompt scored once. A row is the prompt ids the sampler
saw followed by the ids it generated (`Step.prompt_ids + Step.token_ids`, as `JaxPolicy.encode_prompt` produced
them, never re-tokenized text), so the trainer scores exactly the tokens that were sampled. `loss_mask` is 1 on the
generated ids only: the question, the history and the retrieved documents all live in the prompt ids and are
masked, as is padding. `old_logp` holds the sampler's log-probs of the generated ids (the behaviour policy at the
sampling temperature). Steps without generated ids (scripted first actions) give no row; summaries written by a
summarizer (Search-o1, ReasonRAG grounding) are not actions of the policy and carry no loss.

Advantages (GRPO): the B·G episodes of a step come as B contiguous groups of G episodes of one question;
`A_e = (r_e - mean_group) / (std_group + eps)` (METHODS.md §4) is broadcast to every token of every row of the episode.

Aggregation weights: the losses compute Σ_tokens w·objective with `w` fixed here over the whole batch, so an episode
spread over several rows, and rows spread over microbatches, aggregate exactly as the formula says. A "sequence"
is a whole trajectory (all action tokens of one episode), never a row:
- token_mean:              w = 1 / (action tokens of the whole batch)                      (TRL / DAPO)
  with micro = m > 0:      w = 1 / (C · action tokens of e's chunk), the episodes cut into C chunks of m consecutive
                           ones: the token mean of each chunk, averaged over chunks (ARENA's TRL: a micro-batch of
                           4 completions per device, averaged over devices and accumulation steps)
- seq_mean_token_mean:     w = 1 / (E · |o_e|), |o_e| = action tokens of episode e, E = episodes with tokens (GRPO)
- seq_mean_token_sum_norm: w = 1 / (E · L), L a constant token budget per trajectory (Dr. GRPO; default
                           max_new_tokens · max_steps)

PPO: per-token rewards along each trajectory's action tokens (the outcome reward at the last generated token of
the episode, or per-step rewards, e.g. a PRM's, at each action's last token), GAE over the trajectory's action
tokens in order (across rows: the value after an action's last token is the next action's first value), advantages
whitened over the whole batch, token_mean weights.

Length groups: the rows of one update may be split by sequence bucket into several batches (length_groups), each
padded only to its own bucket; the weights above are computed over all rows, so the groups' gradients, summed,
are the update's gradient (jaxrag.rl.loop).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxrag.env.mdp import Episode
from jaxrag import losses
from jaxrag.losses import GRPO_AGGREGATIONS
from jaxrag.train import prefix_tree as PT
from jaxrag.train.batching import bucket_size, group_batch, pick_bucket


class GroupError(ValueError):
    """The episodes do not form contiguous groups of `group_size` episodes of one question each."""

    pass


@dataclasses.dataclass
class Row:
    """One training row: the prompt ids the sampler saw, then the completion ids and their sampler log-probs."""

    episode: int  # index into the step's episode list
    step: int  # index into episode.steps (a merged row: its first step)
    prompt: list[int]
    completion: list[int]
    logprobs: list[float]  # aligned with completion (0.0 where gen_mask is 0)
    gen_mask: list[int] | None = None  # merged rows: 1 = generated id (trained), 0 = observation ids between turns

    @property
    def generated(self) -> int:
        """How many of the completion ids the policy generated (the row's action tokens)."""
        return len(self.completion) if self.gen_mask is None else int(sum(self.gen_mask))

    def completion_mask(self) -> list[int]:
        """The loss mask over the completion ids: 1 = generated (trained), 0 = observation ids."""
        return [1] * len(self.completion) if self.gen_mask is None else list(self.gen_mask)


def action_rows(episodes: Sequence[Episode]) -> list[Row]:
    """One Row per step with generated ids; a step with generated ids but no prompt ids is an error.

    Args:
      episodes: the finished episodes of one RL step.

    Returns:
      The rows, grouped by episode with steps in order; steps without generated ids give none.

    Raises:
      ValueError: if a step has generated ids but no prompt ids, or not one log-prob per generated id.
    """
    rows = []
    for e, ep in enumerate(episodes):
        for s, st in enumerate(ep.steps):
            if not st.token_ids:
                continue
            where = f"episode {e} (question {ep.qid!r}) step {s}"
            if not st.prompt_ids:
                raise ValueError(f"{where}: generated ids without prompt ids; the policy must return "
                                 f"Completion.prompt_ids (JaxPolicy does) so rows hold exactly what was sampled")
            if len(st.logprobs) != len(st.token_ids):
                raise ValueError(f"{where}: {len(st.logprobs)} log-probs for {len(st.token_ids)} generated ids")
            rows.append(Row(e, s, list(st.prompt_ids), list(st.token_ids), list(st.logprobs)))
    return rows


def merge_turns(rows: Sequence[Row]) -> list[Row]:
    """Consecutive action rows of one episode as ONE row wherever the next action's prompt ids begin with this row's
    whole ids (prompt + generated): the tokens between (the environment's observation: retrieved documents, the next
    turn's prefix) are masked, every generated id keeps its own sampler log-prob, and its context is token for token
    the one it was sampled under, so the objective is unchanged while each prompt is scored once instead of once per
    action. Where the ids do not continue (an agent that re-renders or shortens its prompt, a tokenization that does
    not compose), a new row starts. Rows must come grouped by episode, steps in order (as action_rows gives them).

    Args:
      rows: action rows, grouped by episode, steps in order.

    Returns:
      The rows with continuing turns merged (merged rows carry `gen_mask`).
    """
    out: list[Row] = []
    for r in rows:
        last = out[-1] if out else None
        if last is not None and last.episode == r.episode and r.step > last.step:
            whole = last.prompt + last.completion
            if len(r.prompt) >= len(whole) and r.prompt[:len(whole)] == whole:
                obs = r.prompt[len(whole):]
                out[-1] = Row(last.episode, last.step, last.prompt, last.completion + obs + r.completion,
                              last.logprobs + [0.0] * len(obs) + r.logprobs,
                              last.completion_mask() + [0] * len(obs) + [1] * len(r.completion))
                continue
        out.append(r)
    return out


def check_groups(episodes: Sequence[Episode], group_size: int) -> list[str]:
    """The question key of each group; raises GroupError unless the episodes are contiguous groups of exactly
    `group_size` episodes of one question, each question in one group.

    Args:
      episodes: the step's E episodes, groups contiguous.
      group_size: G, the episodes per question.

    Returns:
      The E // G group keys (qid, else the question text), in group order.

    Raises:
      GroupError: if E is not a positive multiple of G, a group mixes questions, or a question spans two groups.
    """
    n = len(episodes)
    if group_size < 1 or n == 0 or n % group_size:
        raise GroupError(f"{n} episodes do not split into groups of group_size={group_size}")
    keys, seen = [], {}
    for g in range(n // group_size):
        members = episodes[g * group_size:(g + 1) * group_size]
        key = members[0].qid or members[0].question
        other = [m.qid or m.question for m in members if (m.qid or m.question) != key]
        if other:
            raise GroupError(f"group {g} (episodes {g * group_size}..{(g + 1) * group_size - 1}) mixes questions "
                             f"{key!r} and {other[0]!r}: every group must be {group_size} episodes of one question")
        if key in seen:
            raise GroupError(f"question {key!r} has {2 * group_size} episodes (groups {seen[key]} and {g}); "
                             f"each question must have exactly group_size={group_size}")
        seen[key] = g
        keys.append(key)
    return keys


def group_advantages(episodes: Sequence[Episode], rewards: Sequence[float], group_size: int, eps: float = 1e-4,
                     std_ddof: int = 1) -> np.ndarray:
    """A_e = (r_e - mean_g) / (std_g + eps) per group of `group_size` episodes of one question -> [E] float32
    (jaxrag.losses.group_advantages in float64 on the host, after checking that each group is one question's).

    Args:
      episodes: the step's E episodes, groups contiguous.
      rewards: [E] scalar reward of each episode.
      group_size: G, the episodes per question.
      eps: added to the group std.
      std_ddof: delta degrees of freedom of the std (1 unbiased, as TRL; 0 population).

    Returns:
      [E] float32 numpy advantages.

    Raises:
      GroupError: as check_groups.
    """
    check_groups(episodes, group_size)
    return losses.group_advantages(np.asarray(rewards, np.float64), group_size, eps, std_ddof)



def row_weights(rows: Sequence[Row], aggregation: str, norm_tokens: int, micro: int = 0) -> np.ndarray:
    """Per-row weight w (every action token of the row gets w); see the module docstring. [R] float64.
    micro > 0 (token_mean only): the token mean within chunks of `micro` consecutive episodes, then their mean.

    Args:
      rows: all rows of the update.
      aggregation: one of GRPO_AGGREGATIONS.
      norm_tokens: L, the token budget per trajectory (seq_mean_token_sum_norm only).
      micro: episodes per chunk for chunked token means; 0 = off.

    Returns:
      [R] float64 weights (empty for no rows).

    Raises:
      ValueError: if `aggregation` is unknown, micro > 0 without token_mean, or norm_tokens < 1 where it is used.
    """
    if aggregation not in GRPO_AGGREGATIONS:
        raise ValueError(f"aggregation={aggregation!r} is not one of {GRPO_AGGREGATIONS}")
    if micro and aggregation != "token_mean":
        raise ValueError(f"micro-batch token means (micro={micro}) need aggregation 'token_mean', got {aggregation!r}")
    if not rows:
        return np.zeros(0)
    per_episode: dict[int, int] = {}
    for r in rows:
        per_episode[r.episode] = per_episode.get(r.episode, 0) + r.generated
    n_ep = len(per_episode)
    if aggregation == "token_mean" and micro > 0:
        per_chunk: dict[int, int] = {}
        for e, n in per_episode.items():
            per_chunk[e // micro] = per_chunk.get(e // micro, 0) + n
        return np.asarray([1.0 / (len(per_chunk) * per_chunk[r.episode // micro]) for r in rows])
    if aggregation == "token_mean":
        return np.full(len(rows), 1.0 / sum(per_episode.values()))
    if aggregation == "seq_mean_token_mean":
        return np.asarray([1.0 / (n_ep * per_episode[r.episode]) for r in rows])
    if norm_tokens < 1:
        raise ValueError(f"seq_mean_token_sum_norm needs a token budget >= 1, got {norm_tokens}")
    return np.full(len(rows), 1.0 / (n_ep * norm_tokens))


def row_bucket(n: int, multiple: int) -> int:
    """Rows padded to a power of two up to 8, then to one of 4 sizes per octave (10, 12, 14, 16, 20, 24, 28, 32,
    40, ...: under 25% padding rows, few compiled shapes), then up to a multiple of `multiple` (data x fsdp x
    grad_accum): jaxrag.train.batching.bucket_size.

    Args:
      n: the number of rows.
      multiple: the padded count's required multiple.

    Returns:
      The padded row count R >= n.
    """
    return bucket_size(n, multiple)


def pack(rows: Sequence[Row], buckets: Sequence[int], pad_id: int = 0, row_multiple: int = 1) -> dict:
    """Rows -> tokens, positions, segment_ids [R,T] int32; loss_mask, old_logp [R,T] float32; row_episode [R]
    int32 (-1 on padding rows). R = row_bucket(len(rows)), T = the smallest bucket holding the longest row.

    Args:
      rows: the rows to pack, one per batch row.
      buckets: the allowed padded sequence lengths T.
      pad_id: the token id of padding.
      row_multiple: R's required multiple (data x fsdp x grad_accum).

    Returns:
      A dict of numpy arrays: tokens, positions, segment_ids, loss_mask, old_logp, row_episode.

    Raises:
      ValueError: if `rows` is empty or the longest row exceeds every bucket.
    """
    if not rows:
        raise ValueError("no rows: no episode generated any token")
    lengths = [len(r.prompt) + len(r.completion) for r in rows]
    t = pick_bucket(max(lengths), buckets, f"RL row {int(np.argmax(lengths))} (prompt + generated ids)")
    n = row_bucket(len(rows), row_multiple)
    tokens = np.full((n, t), pad_id, np.int32)
    seg = np.zeros((n, t), np.int32)
    mask = np.zeros((n, t), np.float32)
    old = np.zeros((n, t), np.float32)
    episode = np.full(n, -1, np.int32)
    for i, r in enumerate(rows):
        p, m = len(r.prompt), len(r.prompt) + len(r.completion)
        tokens[i, :m] = r.prompt + r.completion
        seg[i, :m] = 1
        mask[i, p:m] = r.completion_mask()
        old[i, p:m] = r.logprobs
        episode[i] = r.episode
    positions = np.broadcast_to(np.arange(t, dtype=np.int32), (n, t)).copy()
    return {"tokens": tokens, "positions": positions, "segment_ids": seg, "loss_mask": mask, "old_logp": old,
            "row_episode": episode}


def length_groups(rows: Sequence[Row], buckets: Sequence[int], by_length: bool = True) -> list[list[int]]:
    """Row indices of each sub-batch of one update: one per sequence bucket (the smallest holding the row), so a
    short row is not padded to the longest row of the step; or all rows in one (by_length False).

    Args:
      rows: all rows of the update.
      buckets: the allowed padded sequence lengths.
      by_length: split by bucket; False = one group.

    Returns:
      Lists of row indices, one per group, in increasing bucket order.

    Raises:
      ValueError: if a row exceeds every bucket.
    """
    if not by_length:
        return [list(range(len(rows)))]
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(pick_bucket(len(r.prompt) + len(r.completion), buckets, f"RL row {i}"), []).append(i)
    return [groups[b] for b in sorted(groups)]


def grpo_batches(rows: Sequence[Row], advantages: np.ndarray, aggregation: str, norm_tokens: int,
                 buckets: Sequence[int], pad_id: int = 0, row_multiple: int = 1, by_length: bool = False,
                 micro: int = 0) -> list[dict]:
    """The device batches of one GRPO update (one per length group): pack() + advantages [R] (the episode's A) +
    token_weight [R,T], the weights computed over ALL rows of the update, so the groups' gradients sum to it.

    Args:
      rows: all rows of the update.
      advantages: [E] the advantage of each episode (group_advantages).
      aggregation, norm_tokens, micro: as row_weights.
      buckets, pad_id, row_multiple: as pack.
      by_length: one batch per sequence bucket (length_groups); False = one batch.

    Returns:
      One dict per length group: pack()'s arrays (without row_episode), advantages [R] float32 and
      token_weight [R, T] float32.

    Raises:
      ValueError: as row_weights and pack.
    """
    w = row_weights(rows, aggregation, norm_tokens, micro)
    out = []
    for idx in length_groups(rows, buckets, by_length):
        sub = [rows[i] for i in idx]
        b = pack(sub, buckets, pad_id, row_multiple)
        n = b["tokens"].shape[0]
        adv, row_w = np.zeros(n, np.float32), np.zeros(n, np.float64)
        adv[:len(sub)] = [advantages[r.episode] for r in sub]
        row_w[:len(sub)] = w[idx]
        b["advantages"] = adv
        b["token_weight"] = (b["loss_mask"] * row_w[:, None]).astype(np.float32)
        del b["row_episode"]
        out.append(b)
    return out


def grpo_batch(rows: Sequence[Row], advantages: np.ndarray, aggregation: str, norm_tokens: int,
               buckets: Sequence[int], pad_id: int = 0, row_multiple: int = 1, micro: int = 0) -> dict:
    """grpo_batches with every row in one batch.

    Args:
      rows, advantages, aggregation, norm_tokens, buckets, pad_id, row_multiple, micro: as grpo_batches.

    Returns:
      The one batch dict of grpo_batches.
    """
    return grpo_batches(rows, advantages, aggregation, norm_tokens, buckets, pad_id, row_multiple, False, micro)[0]


def tree_inputs(rows: Sequence[Row]) -> list[tuple]:
    """Rows as prefix_tree.pack_tree's (prompt, completion, completion mask) triples: reads at the generated ids.

    Args:
      rows: the rows.

    Returns:
      One (prompt, completion, gen_mask) tuple per row.
    """
    return [(r.prompt, r.completion, r.gen_mask) for r in rows]


def row_tree(rows: Sequence[Row], buckets: Sequence[int], mcfg, pad_id: int = 0, row_multiple: int = 1) -> PT.Tree:
    """The rows packed as a prefix tree at the pack length (a bucket) of least work (prefix_tree.best_tree).

    Args:
      rows: the rows.
      buckets: the allowed pack lengths.
      mcfg: the ModelConfig, for the FLOP cost model.
      pad_id: the token id of padding.
      row_multiple: the pack count's required multiple.

    Returns:
      The prefix_tree.Tree.

    Raises:
      ValueError: if the longest row exceeds every bucket.
    """
    return PT.best_tree(tree_inputs(rows), buckets, mcfg, pad_id, row_multiple, "RL row")


def grpo_tree_batch(rows: Sequence[Row], advantages: np.ndarray, aggregation: str, norm_tokens: int,
                    tree: PT.Tree) -> dict:
    """The GRPO update as one prefix-tree batch (jaxrag.train.prefix_tree): the packs [P,L] and, per read [P,M]
    (one per generated id of every row), old_logp, the episode's advantage and the row's aggregation weight: the
    same objective and gradient as grpo_batches, every shared prefix computed once.

    Args:
      rows: all rows of the update.
      advantages: [E] the advantage of each episode.
      aggregation, norm_tokens: as row_weights.
      tree: row_tree(rows, ...).

    Returns:
      tree.arrays() plus old_logp, advantages and token_weight [P, M].

    Raises:
      ValueError: as row_weights.
    """
    w = row_weights(rows, aggregation, norm_tokens)
    b = tree.arrays()
    b["old_logp"] = tree.scatter([r.logprobs for r in rows])
    b["advantages"] = tree.scatter([np.full(len(r.completion), advantages[r.episode]) for r in rows])
    b["token_weight"] = tree.scatter([np.full(len(r.completion), w[i]) for i, r in enumerate(rows)])
    return b


def rows_shapes(rows: Sequence[Row], buckets: Sequence[int], row_multiple: int = 1,
                by_length: bool = False) -> list[tuple[int, int]]:
    """The [R, T] shapes grpo_batches / pack give these rows (for the layout's cost model).

    Args:
      rows, buckets, row_multiple, by_length: as grpo_batches.

    Returns:
      One (R, T) tuple per length group.
    """
    out = []
    for idx in length_groups(rows, buckets, by_length):
        longest = max(len(rows[i].prompt) + len(rows[i].completion) for i in idx)
        out.append((row_bucket(len(idx), row_multiple), pick_bucket(longest, buckets, "RL row")))
    return out


def token_rewards(rows: Sequence[Row], outcome: Sequence[float],
                  step_rewards: Sequence[Sequence[float]] | None = None) -> list[np.ndarray]:
    """Per-row rewards on the generated ids: the episode's outcome reward at the last generated id of its last row,
    or (step_rewards[e][s] given) each step's reward at the last generated id of that step's row.

    Args:
      rows: all rows of the update.
      outcome: [E] the outcome reward of each episode.
      step_rewards: optional per-episode, per-step rewards (e.g. a PRM's); None = outcome rewards.

    Returns:
      Per row, a float32 array with one reward per completion id.
    """
    last_row = {}
    for i, r in enumerate(rows):
        last_row[r.episode] = i
    out = []
    for i, r in enumerate(rows):
        x = np.zeros(len(r.completion), np.float32)
        if step_rewards is not None:
            x[-1] = float(step_rewards[r.episode][r.step])
        elif last_row[r.episode] == i:
            x[-1] = float(outcome[r.episode])
        out.append(x)
    return out


def trajectory_gae(rows: Sequence[Row], values: Sequence[np.ndarray], rewards: Sequence[np.ndarray], gamma: float,
                   lam: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """GAE over each episode's action tokens in order (rows of one episode concatenated; the value after the
    episode's last action token is 0). values/rewards: per row, one entry per generated id.

    Args:
      rows: all rows of the update.
      values: per row, the value estimate of each completion id.
      rewards: per row, the reward of each completion id (token_rewards).
      gamma: γ, the discount.
      lam: λ, the GAE parameter.

    Returns:
      Per-row (advantages, returns = advantages + values), lists of float32 arrays.
    """
    by_ep: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_ep.setdefault(r.episode, []).append(i)
    adv = [np.zeros(len(r.completion), np.float32) for r in rows]
    for idx in by_ep.values():
        idx = sorted(idx, key=lambda i: rows[i].step)
        v = np.concatenate([np.asarray(values[i], np.float64) for i in idx])
        rw = np.concatenate([np.asarray(rewards[i], np.float64) for i in idx])
        a = np.zeros_like(v)
        next_v, next_a = 0.0, 0.0
        for t in range(len(v) - 1, -1, -1):
            delta = rw[t] + gamma * next_v - v[t]
            next_a = delta + gamma * lam * next_a
            next_v = v[t]
            a[t] = next_a
        cut = np.cumsum([len(rows[i].completion) for i in idx])[:-1]
        for i, part in zip(idx, np.split(a, cut)):
            adv[i] = part.astype(np.float32)
    returns = [a + np.asarray(v, np.float32) for a, v in zip(adv, values)]
    return adv, returns


def ppo_batches(rows: Sequence[Row], groups: Sequence[Sequence[int]], packed: Sequence[dict],
                old_values: Sequence[np.ndarray], outcome: Sequence[float],
                step_rewards: Sequence[Sequence[float]] | None, gamma: float, lam: float, whiten: bool) -> list[dict]:
    """The device batches of one PPO update from pack() outputs of the row groups and the value head's estimates
    old_values [R,T] of each (token_values alignment): old_values, advantages, returns [R,T] and token_mean
    weights over all rows. GAE runs along each trajectory across groups; advantages are whitened over all rows.

    Args:
      rows: all rows of the update.
      groups: the row indices of each batch (length_groups).
      packed: pack() of each group.
      old_values: per group, the value head's [R, T] estimates.
      outcome, step_rewards: as token_rewards.
      gamma: γ, the discount.
      lam: λ, the GAE parameter.
      whiten: whiten advantages over all rows.

    Returns:
      One dict per group: pack()'s arrays (without row_episode) plus old_values, advantages, returns and
      token_weight [R, T] float32.
    """
    vals: list = [None] * len(rows)
    for idx, ov in zip(groups, old_values):
        for j, i in enumerate(idx):
            p = len(rows[i].prompt)
            vals[i] = np.asarray(ov[j, p:p + len(rows[i].completion)], np.float32)
    adv, ret, total = ppo_targets(rows, vals, outcome, step_rewards, gamma, lam, whiten)
    out = []
    for idx, pk in zip(groups, packed):
        b = {k: v for k, v in pk.items() if k != "row_episode"}
        shape = b["tokens"].shape
        for key in ("old_values", "advantages", "returns"):
            b[key] = np.zeros(shape, np.float32)
        for j, i in enumerate(idx):
            p, m = len(rows[i].prompt), len(rows[i].prompt) + len(rows[i].completion)
            b["old_values"][j, p:m] = vals[i]
            b["advantages"][j, p:m] = adv[i]
            b["returns"][j, p:m] = ret[i]
        b["token_weight"] = (b["loss_mask"] / total).astype(np.float32)
        out.append(b)
    return out


def ppo_targets(rows: Sequence[Row], vals: Sequence[np.ndarray], outcome: Sequence[float],
                step_rewards: Sequence[Sequence[float]] | None, gamma: float, lam: float,
                whiten: bool) -> tuple[list, list, float]:
    """Per-row advantages and returns from per-row old values (one per generated id): GAE along each trajectory,
    advantages whitened over all rows; and the action-token count the token_mean weights divide by.

    Args:
      rows: all rows of the update.
      vals: per row, the old value of each completion id.
      outcome, step_rewards: as token_rewards.
      gamma: γ, the discount.
      lam: λ, the GAE parameter.
      whiten: whiten advantages over all rows.

    Returns:
      (advantages, returns, action tokens): per-row arrays, and the count as a float (at least 1).
    """
    adv, ret = trajectory_gae(rows, vals, token_rewards(rows, outcome, step_rewards), gamma, lam)
    flat = np.concatenate(adv) if adv else np.zeros(0)
    if whiten and flat.size > 1:
        mean, std = flat.mean(), flat.std()
        adv = [(a - mean) / np.sqrt(std * std + 1e-8) for a in adv]
    return adv, ret, max(float(sum(r.generated for r in rows)), 1.0)


def ppo_tree_batch(rows: Sequence[Row], tree: PT.Tree, old_values: np.ndarray, outcome: Sequence[float],
                   step_rewards: Sequence[Sequence[float]] | None, gamma: float, lam: float, whiten: bool) -> dict:
    """The PPO update as one prefix-tree batch: old_values [P,M] the value head at the tree's reads (the score
    function on tree.arrays()); GAE, whitening and token_mean weights as ppo_batches, placed at the reads.

    Args:
      rows: all rows of the update.
      tree: row_tree(rows, ...).
      old_values: [P, M] the value head at the tree's reads.
      outcome, step_rewards, gamma, lam, whiten: as ppo_batches.

    Returns:
      tree.arrays() plus old_logp, old_values, advantages, returns and token_weight [P, M].
    """
    vals = tree.gather(np.asarray(old_values, np.float32))
    adv, ret, total = ppo_targets(rows, vals, outcome, step_rewards, gamma, lam, whiten)
    b = tree.arrays()
    b["old_logp"] = tree.scatter([r.logprobs for r in rows])
    b["old_values"] = tree.scatter(vals)
    b["advantages"] = tree.scatter(adv)
    b["returns"] = tree.scatter(ret)
    b["token_weight"] = (b["loss_mask"] / total).astype(np.float32)
    return b


def ppo_batch(rows: Sequence[Row], packed: dict, old_values: np.ndarray, outcome: Sequence[float],
              step_rewards: Sequence[Sequence[float]] | None, gamma: float, lam: float, whiten: bool) -> dict:
    """ppo_batches with every row in one batch.

    Args:
      rows: all rows of the update.
      packed: pack(rows, ...).
      old_values: [R, T] the value head's estimates.
      outcome, step_rewards, gamma, lam, whiten: as ppo_batches.

    Returns:
      The one batch dict of ppo_batches.
    """
    return ppo_batches(rows, [list(range(len(rows)))], [packed], [old_values], outcome, step_rewards, gamma, lam,
                       whiten)[0]


def group_batch_auto(groups, buckets: Sequence[int], mcfg, mode: str = "auto", pad_id: int = 0,
                     pack_multiple: int = 1, group_size: int | None = None, adv_eps: float = 1e-4,
                     std_ddof: int = 1, aggregation: str = "seq_mean_token_mean") -> dict:
    """File-based GRPO groups (train.batching.Group: one prompt, G scored completions) in the layout `mode` picks
    (prefix_tree.choose_layout): batching.group_batch (advantages computed on device by objectives.grpo_prepare), or
    one prefix-tree batch whose G completions share their prompt's computation. The tree batch brings what the
    per-row batch leaves to the device: the group-normalized advantages (losses.group_advantages, the same formula
    and float32 arithmetic) and the aggregation weights of the per-row batch's loss: a row is a sequence, and
    seq_mean_token_sum_norm's constant is that batch's padded length T (losses._aggregate divides by N·T). Groups
    without old log-probs train on-policy in both layouts (the objective takes the current log-probs).

    Args:
      groups: the train.batching.Group list of the batch.
      buckets: the allowed padded sequence lengths.
      mcfg: the ModelConfig, for the layout's cost model.
      mode: "auto", "rows" or "tree" (prefix_tree.LAYOUTS).
      pad_id: the token id of padding.
      pack_multiple: the tree's pack count's required multiple.
      group_size: G; None = the completions of the first group.
      adv_eps, std_ddof: as losses.group_advantages.
      aggregation: one of GRPO_AGGREGATIONS.

    Returns:
      The batch dict: group_batch's, or the tree batch (grpo_tree_batch; without old_logp when on-policy).

    Raises:
      ValueError: if `mode` is not a known layout or a row exceeds every bucket.
    """
    PT.check_layout(mode, "train_layout")
    rows_b = group_batch(groups, buckets, pad_id)
    if mode == "rows":
        return rows_b
    G = group_size or len(groups[0].completions)
    on_policy = "old_logp" not in rows_b   # group_batch's own rule: old log-probs only where every group has them
    rows = [Row(i, 0, list(g.prompt), list(c), [0.0] * len(c) if on_policy else list(g.old_logps[j]))
            for i, (g, j, c) in enumerate((g, j, c) for g in groups for j, c in enumerate(g.completions))]
    tree = row_tree(rows, buckets, mcfg, pad_id, pack_multiple)
    N, T = rows_b["tokens"].shape
    if mode == "auto" and PT.choose_layout("auto", PT.rows_work([(N, T)]), PT.tree_work(tree), mcfg)[0] == "rows":
        return rows_b
    adv = np.asarray(losses.group_advantages(rows_b["rewards"], G, adv_eps, std_ddof))
    b = grpo_tree_batch(rows, adv, aggregation, T, tree)
    if on_policy:
        del b["old_logp"]
    return b
