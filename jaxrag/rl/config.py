"""RLConfig: the host-side settings of online RL (what to sample, how often to update), and the trainer settings it
fixes. Defaults are neutral; the papers' values live in configs/arena/grpo.py and configs/smartsearch/grpo.py."""

from __future__ import annotations

import dataclasses

import ml_collections

from jaxrag.env.rollout import RolloutConfig
from jaxrag.train import config as tconfig
from jaxrag.train.objectives import get

# RLConfig's fields that are the rollout engine's own (same name, same meaning): rollout_config passes them on
ROLLOUT_FIELDS = ("temperature", "max_new_tokens", "max_steps", "k", "max_invalid", "continuous",
                  "summary_max_new_tokens")
# the engine fields rollout_config sets from RL's own settings (rollout_batch, seed and step) or fixes
ROLLOUT_DERIVED = ("batch_size", "n_candidates", "seed", "episode_reward")
# the engine fields RL leaves at their defaults: the return's discount and the env reward (RL scores with its own
# reward), summaries' temperature, progress bars, the continuous engine's host overlap
ROLLOUT_DEFAULTS = ("gamma", "reward", "summary_temperature", "progress", "overlap")


def rollout_seed(seed: int, step: int) -> int:
    """The rollout's base sampling seed at an RL step (the engine adds its own step index < 10007)."""
    return (seed * 1_000_003 + step * 10_007) % (2**31 - 1)


RL_LAYOUTS = ("groups", "ppo")   # the losses online RL trains: group-normalized advantages, or PPO's value head


def rl_layout(tc) -> str:
    """The layout of the trainer config's loss ("groups": GRPO or any group loss of the table or a user module;
    "ppo"): what the RL loop builds its rows for. Another layout fails in one line."""
    layout = get(tc.loss).layout
    if layout not in RL_LAYOUTS:
        raise ValueError(f"train config: loss: online RL trains losses of layout {' | '.join(RL_LAYOUTS)} (grpo, "
                         f"ppo), got {tc.loss!r} of layout {layout!r}")
    return layout
GROUP_ROLLOUTS = ("independent", "smartsearch_refine")  # jaxrag.rl.group_rollout.STRATEGIES


@dataclasses.dataclass(frozen=True)
class RLConfig:
    steps: int = 10  # RL steps: sample B·G episodes with the current params, then `inner_steps` updates on them
    questions_per_step: int = 4  # B
    group_size: int = 4  # G episodes per question: each question is rolled out G times (one sample per row)
    inner_steps: int = 1  # epochs over one step's episodes (the ratio leaves 1 after the first update)
    minibatches: int = 1  # updates per epoch, each on B/minibatches whole groups (SmartSearch/verl: 256/64 = 4)
    temperature: float = 1.0  # sampling temperature of every action (ARENA 0.9); 0 = greedy (scored at T = 1)
    # the temperature the trainer scores log-probs (ratio, KL) at: 0 = the sampling temperature (the sampler's own
    # log-probs are the behaviour policy's); > 0 = that temperature (ARENA's TRL: 1.0 while sampling at 0.9), the
    # old log-probs then rescored by the trainer before the step's first update
    logprob_temperature: float = 0.0
    # token_mean over chunks of this many consecutive episodes, then the mean over chunks (ARENA's TRL: 4, the
    # per-device micro-batch); 0 = one token mean over the whole update
    token_mean_micro: int = 0
    max_new_tokens: int = 256  # per action
    max_steps: int = 10  # actions per episode (RAG-Gym: 10)
    k: int = RolloutConfig.k  # documents per search (the engine's default)
    max_invalid: int = 1  # an episode ends after this many Invalid actions
    rollout_batch: int = 0  # live episodes per engine step; 0 = all B·G at once
    # sample through the policy's continuous slot pool (RolloutConfig.continuous: a finished turn's slot takes the
    # next waiting one; a group's identical first prompts share one prefill); with the policy section's
    # pool_sessions, each episode's later turns prefill only what they append. False = lock-step engine steps
    continuous: bool = False
    summary_max_new_tokens: int = 256  # Search-o1 / ReasonRAG summaries (never trained)
    norm_tokens: int = 0  # Dr. GRPO's constant token budget per trajectory; 0 = max_new_tokens · max_steps
    # one sub-batch per sequence bucket, gradients summed: less padding, but more compiled shapes (pays off once
    # the shape set saturates: long runs, a persistent compilation cache); False = one padded batch per update
    length_groups: bool = False
    # GRPO: an episode's consecutive actions as one row wherever the next prompt's ids continue the last row's ids
    # (rows.merge_turns: the same objective, each prompt scored once); False = one row per action
    merge_turns: bool = True
    # the update's batch layout (jaxrag.train.prefix_tree): "tree" packs the rows as a prefix tree (each shared
    # prefix, a group's first prompt, a turn's history, computed once; the same objective), "rows" one padded row
    # each, "auto" the tree where the cost model says it saves work and the attention path takes its mask
    train_layout: str = "auto"
    seed: int = 0  # question order (epoch permutations) and rollout sampling keys derive from (seed, step)
    shuffle: bool = True
    save_episodes: bool = True  # append every step's episodes to <workdir>/episodes.jsonl (prompt ids dropped)
    # how a step's groups are sampled (jaxrag.rl.group_rollout): "independent" = G independent episodes per question;
    # "smartsearch_refine" = SmartSearch stage 3: y0, its bad queries refined and regenerated, <= refine_keep_m
    # episodes per expansion set, repeated until G (needs a refiner: the rl stage's `judge` section)
    group_rollout: str = "independent"
    refine_keep_m: int = 2  # M: episodes kept per expansion set {y0, y1, ...} (released code: y0 + the first refined)
    refine_query_loss: bool = True  # train the refiner's query tokens under the current policy's recomputed
    # log-probs (released code: loss_mask 1, old log-probs recomputed by the actor); False = no loss on them

    def rollout_config(self, step: int, n_episodes: int) -> RolloutConfig:
        """The engine's settings for RL step `step`'s n_episodes (B·G): the one place RL's sampling fields
        (ROLLOUT_FIELDS) become a RolloutConfig. One candidate per state, a per-step seed (rollout_seed), and
        ep.reward left to the RL reward (score_episodes); every other engine field keeps its default."""
        return RolloutConfig(**{f: getattr(self, f) for f in ROLLOUT_FIELDS},
                             batch_size=self.rollout_batch or n_episodes, n_candidates=1,
                             seed=rollout_seed(self.seed, step), episode_reward=False)

    @property
    def episodes_per_step(self) -> int:
        return self.questions_per_step * self.group_size

    @property
    def updates_per_step(self) -> int:
        return self.inner_steps * self.minibatches

    @property
    def scoring_temperature(self) -> float:
        """The trainer's log-prob temperature (train.sampling_temperature of the RL run)."""
        if self.logprob_temperature > 0:
            return float(self.logprob_temperature)
        return float(self.temperature) if self.temperature > 0 else 1.0

    @property
    def rescore_old_logp(self) -> bool:
        """The sampler's log-probs are not at the scoring temperature: the trainer rescores the old log-probs."""
        return self.scoring_temperature != (float(self.temperature) if self.temperature > 0 else 1.0)

    @property
    def token_budget(self) -> int:
        return self.norm_tokens or self.max_new_tokens * self.max_steps

    def validate(self) -> None:
        for key in ("steps", "questions_per_step", "group_size", "inner_steps", "minibatches", "max_new_tokens",
                    "max_steps", "k", "max_invalid"):
            if int(getattr(self, key)) < 1:
                raise ValueError(f"rl config: {key}: must be >= 1, got {getattr(self, key)}")
        if self.questions_per_step % self.minibatches:
            raise ValueError(f"rl config: minibatches: {self.minibatches} does not divide questions_per_step "
                             f"{self.questions_per_step} (a minibatch holds whole groups)")
        if self.temperature < 0:
            raise ValueError(f"rl config: temperature: must be >= 0, got {self.temperature}")
        if self.logprob_temperature < 0 or self.token_mean_micro < 0:
            raise ValueError(f"rl config: logprob_temperature and token_mean_micro must be >= 0, got "
                             f"{self.logprob_temperature} and {self.token_mean_micro}")
        if self.rollout_batch < 0 or self.norm_tokens < 0:
            raise ValueError("rl config: rollout_batch and norm_tokens must be >= 0")
        if self.train_layout not in ("auto", "rows", "tree"):
            raise ValueError(f"rl config: train_layout: {self.train_layout!r} is not one of ('auto', 'rows', 'tree')")
        if self.group_rollout not in GROUP_ROLLOUTS:
            raise ValueError(f"rl config: group_rollout: {self.group_rollout!r} is not one of {GROUP_ROLLOUTS}")
        if int(self.refine_keep_m) < 1:
            raise ValueError(f"rl config: refine_keep_m: must be >= 1 (y0 itself), got {self.refine_keep_m}")

    @staticmethod
    def from_dict(d) -> "RLConfig":
        d = dict(d)
        fields = {f.name for f in dataclasses.fields(RLConfig)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise KeyError(f"rl config: unknown key(s) {unknown}; known: {sorted(fields)}")
        rc = RLConfig(**d)
        rc.validate()
        return rc


def default_rl_config() -> ml_collections.ConfigDict:
    """RLConfig's fields as a ConfigDict (for config files; every key typed, unknown keys fail)."""
    return ml_collections.ConfigDict(dataclasses.asdict(RLConfig()))


def rl_train_config(rc: RLConfig, train_config=None) -> ml_collections.ConfigDict:
    """The trainer config of an RL run: `train_config` with the keys the RL loop owns set from `rc`:
    sampling_temperature = rc.scoring_temperature (the log-prob temperature: rc.temperature, 1 when greedy, or
    rc.logprob_temperature), grpo.group_size = G, batch_size = B·G / minibatches
    (episodes per update; rows are padded to a multiple of grad_accum), steps = rc.steps · inner_steps · minibatches
    (optimizer steps, for the learning-rate schedule). The loss's layout must be one of RL_LAYOUTS."""
    tc = tconfig.resolve(train_config, check=False)   # validated below, with the batch size the loop sets
    rl_layout(tc)
    with tc.unlocked():
        tc.sampling_temperature = rc.scoring_temperature
        tc.grpo.group_size = rc.group_size
        tc.batch_size = rc.episodes_per_step // rc.minibatches
        tc.steps = rc.steps * rc.updates_per_step
    tconfig.validate(tc)
    if rc.token_mean_micro and (rl_layout(tc) != "groups" or tc.grpo.aggregation != "token_mean"):
        raise ValueError(f"rl config: token_mean_micro: {rc.token_mean_micro} needs a group loss ('grpo') with "
                         f"grpo.aggregation 'token_mean' (got {tc.loss!r}, {tc.grpo.aggregation!r})")
    if rc.train_layout == "tree" and (why := tree_unsupported(rc, tc)):
        raise ValueError(f"rl config: train_layout: 'tree' cannot train with {why}; use 'auto' or 'rows'")
    return tc


def tree_unsupported(rc: RLConfig, tc) -> str:
    """Why the prefix-tree layout cannot train this RL config ("" where it can): ARENA's token mean per micro-batch
    of completions (rows.row_weights' `micro`) and old log-probs rescored before the update are built for the
    per-row layout only."""
    if rc.token_mean_micro:
        return "token_mean_micro (a token mean per micro-batch of rows)"
    if rc.rescore_old_logp and not (rl_layout(tc) == "groups" and rc.updates_per_step == 1):
        return "old log-probs rescored at rl.logprob_temperature"
    return ""
