"""Policy: text prompts in, sampled completions out. The rollout engine knows only this protocol.

`JaxPolicy` runs jaxrag's jitted sampler over a params pytree; tests use scripted fakes with the same method.

Prompt budget (optional part of the protocol): a policy with a context limit also has
`prompt_fits(prompt, max_new_tokens) -> bool`. The rollout engine passes it to `agent.render(state, fits)`, and
the agent, which knows its format, drops whole old steps (never the question) until the prompt fits. The policy
only supplies the budget; what it still gets over budget (a question alone longer than the context) it cuts in
the middle of the token ids, keeping the head (BOS, system prompt) and the tail (generation prompt), counted in
`prompts_cut` and warned about once.

Sessions (optional, off by default): a JaxPolicy built with `session_slots > 0` keeps each episode's KV cache
between turns (jaxrag.sampling.sessions): `generate(..., n=N, sessions=[key per prompt])` prefills only what a prompt
appends to its session's last prompt + one of its last N completions (a branch per candidate, a slot each: the
pool needs prompts x N slots; else the whole prompt, counted as a fallback), once per prompt, and
`release(keys)` frees finished episodes' slots. `keeps_sessions` tells the rollout engine to pass keys.

Continuous batching (optional part of the protocol): `policy.continuous(slots, temperature=, max_new_tokens=, stop=,
seed=, group=)` returns a `ContinuousSession` over a jaxrag.sampling.continuous.SlotPool of `slots` decode slots x
`pool_tokens` tokens: `submit(rid, prompt, fold)`, `launch()` / `collect() -> [(rid, Completion)]` (or `step()`), so a
finished request's slot takes the next waiting prompt (requests inserted together with one prompt share its prefill;
`group` = N > 1: requests come N to a prompt, the candidates of a turn, which the pool may keep in groups of N slots
reading their prompt once: SlotPool(group=N), used when the policy's `cascade` is on and no prefix cache is kept). The
rollout engine uses it with RolloutConfig(continuous=True), n_candidates > 1 included; a policy without the method
(the scripted fakes) keeps the lock-step path. With `JaxPolicy(pool_sessions=True)` (or `continuous(...,
sessions=True)`) the pool keeps KV sessions: `submit(..., session=key)` continues the key's parked row, prefilling
only the appended ids; `release(keys)`; the session's `keeps_sessions` tells the rollout engine to pass keys.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Protocol, Sequence

import jax

from jaxrag.models.config import ModelConfig
from jaxrag.models.transformer import unstack_layers
from jaxrag.sampling.continuous import SlotPool
from jaxrag.sampling.generate import SamplingParams, place_for_decode, sample
from jaxrag.sampling.sessions import MIN_SHARED, SessionPool, sample_sessions

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Completion:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "eos" | "stop" | "length"
    prompt_ids: list[int] = dataclasses.field(default_factory=list)


class Policy(Protocol):
    def generate(
        self,
        prompts: Sequence[str],
        *,
        n: int = 1,
        temperature: float = 0.0,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        seed: int = 0,
    ) -> list[list[Completion]]:
        """Outer list: one entry per prompt; inner: its n samples."""
        ...


class JaxPolicy:
    """The model + tokenizer as a Policy.

    Prompt tokens: exactly one BOS (`add_bos`; none doubled when the chat template already starts with it) and
    at most `prompt_budget(max_new_tokens) = min(max_prompt_tokens or max_seq_len, max_seq_len - max_new_tokens)`
    tokens (see the module doc for who shortens over-long prompts).
    share_prefix: n samples of a prompt prefill it once and fork its cache (generate.sample); False = the
    replicate-and-prefill path (same results, n times the prefill). cascade: the forked rows read their prompt's
    cache once per group instead of copying it (generate.sample's cascade; False = fork by copying). unstack: hold
    the params with per-layer weight buffers (models.unstack_layers: decode reads each weight once instead of
    copying a slice of the stacked one; one copy of the layer weights). `prefill_tokens` counts the token slots prefilled so far,
    `decode_slots` / `decode_tokens` the decode row-steps run / the tokens kept (their ratio: how full the decode
    batch was), `timing` the seconds in prefill (with the host's batch preparation) and in decode.
    session_slots / session_tokens: the session pool (module doc; 0 slots = off; the rollout's batch_size x
    n_candidates slots); session_tokens defaults to max_seq_len, the longest prompt + completion the policy can
    take anyway.
    pool_tokens: the tokens per slot of the continuous-batching pool (`continuous`; default max_seq_len): a
    request whose prompt + max_new_tokens exceeds it is refused with an error naming this setting. Every decode
    step attends over all of a slot's tokens (the lock-step sampler over its batch's bucketed prompt + new tokens),
    so size it to the prompt budget + max_new_tokens, not beyond.
    pool_sessions: the continuous pool keeps sessions (SlotPool(sessions=True)): a finished request's row stays
    parked in its slot and the session's next request prefills only the ids it appends (the rollout engine passes
    one session per episode; at n_candidates > 1 the session's rows of a turn park as branches and the next turn
    continues the picked one, forked to its candidates); `pool_stats` counts reuses and fallbacks.
    min_shared: both session kinds also reuse a branch whose held ids the next prompt does not extend, keeping
    their common prefix when it is at least this many ids and a quarter of the prompt (sessions.shared_prefix;
    0: extensions only).
    prefix_cache: with pool_sessions, `continuous` keeps its slot pool between calls of the same settings (slots,
    sampling, stop strings; new params drop it) and a finished session's rows stay in it as cached rows, so a
    later request of any session forks from the cached row that shares the most of its ids (SlotPool's
    prefix_cache): MCTS rollouts from a node keep the prompt of the node's parent that earlier rollouts left.
    min_rows / min_prompt: the sampler's shape floors (generate.sample): fewer compiled programs for small models.
    mesh / decode_budget_bytes: decode over a mesh (default: the one the params live on, e.g. the RL trainer's):
    each params update (policy load, RL step) lays the weights out once for decoding (generate.place_for_decode:
    whole on every device where they fit the budget, else split over the tensor axis) and `generate` splits its
    rows over data x fsdp; the budget (bytes per device; default: what the device reports, none on CPU) is checked
    before compiling."""

    def __init__(self, cfg: ModelConfig, params, tokenizer, *, top_k: int = 0, top_p: float = 1.0,
                 add_bos: bool = True, max_prompt_tokens: int | None = None, share_prefix: bool = True,
                 cascade: bool = True, unstack: bool = True, session_slots: int = 0,
                 session_tokens: int | None = None, pool_tokens: int | None = None, pool_sessions: bool = False,
                 min_shared: int = MIN_SHARED, prefix_cache: bool = False, min_rows: int = 1, min_prompt: int = 16,
                 mesh=None, decode_budget_bytes: int | None = None):
        self.cfg, self.tokenizer, self.unstack = cfg, tokenizer, unstack
        self.mesh, self.decode_budget_bytes, self.decode_layout = mesh, decode_budget_bytes, None
        self.min_rows, self.min_prompt = min_rows, min_prompt
        self.pool_tokens, self.pool_sessions = pool_tokens or cfg.max_seq_len, pool_sessions
        self.pool_stats = collections.Counter()   # the continuous pools' counters (SlotPool.stats), summed
        self.min_shared, self.prefix_cache = min_shared, prefix_cache
        self._pool, self._pool_spec = None, None   # the slot pool kept between `continuous` calls (prefix_cache)
        self.sessions = (SessionPool(cfg, session_slots, session_tokens or cfg.max_seq_len, min_shared)
                         if session_slots else None)
        self.timing = {"prefill_s": 0.0, "decode_s": 0.0}
        self.params = params
        self.top_k, self.top_p, self.add_bos = top_k, top_p, add_bos
        self.max_prompt_tokens = max_prompt_tokens
        self.prompts_cut = 0
        self._encoded: dict[str, list[int]] = {}
        self.share_prefix, self.cascade, self.prefill_tokens = share_prefix, cascade, 0
        self.decode_slots = self.decode_tokens = 0   # decode row-steps run / tokens kept: the batch's fill
        self.device_stops, self._stop_ids = True, {}  # one-token stop strings also end rows on device

    _CACHE = 256   # encoded prompts kept between prompt_fits and generate

    @property
    def params(self):
        """The params as given (stacked layers: what the trainer builds on); setting them (the RL loop's sync)
        also refreshes the per-layer copy the sampler decodes with."""
        return self._params

    @params.setter
    def params(self, value) -> None:
        self._params = value
        if getattr(self, "sessions", None) is not None:
            self.sessions.clear()   # cached keys/values belong to the old params
        self._pool = None
        if value is not None:   # the decode layout, chosen once per params (a load, an RL step's sync)
            value, self.decode_layout = place_for_decode(self.cfg, value, self.mesh, self.decode_budget_bytes)
        self._sample_params = unstack_layers(value) if self.unstack and value is not None else value

    def stop_token_ids(self, stop_strings) -> tuple[int, ...]:
        """The ids of the stop strings that are one token each (decode(encode(s)) == s): checked on device every
        step, so a row ends at its stop instead of running to the end of the host's check chunk. The host check
        still runs (a stop inside a longer token); tokens, log-probs and finish reasons are the same."""
        if not stop_strings:
            return ()
        key = tuple(stop_strings)
        if key not in self._stop_ids:
            one = [(s, self.tokenizer.encode(s)) for s in stop_strings]
            self._stop_ids[key] = tuple(sorted({ids[0] for s, ids in one if len(ids) == 1 and self.tokenizer.decode(ids) == s}))
        return self._stop_ids[key]

    def prompt_budget(self, max_new_tokens: int) -> int:
        limit = min(self.max_prompt_tokens or self.cfg.max_seq_len, self.cfg.max_seq_len - max_new_tokens)
        if limit < 1:
            raise ValueError(f"no room for a prompt: max_new_tokens={max_new_tokens} >= the model's "
                             f"max_seq_len={self.cfg.max_seq_len}")
        return limit

    def _encode(self, prompt: str) -> list[int]:
        ids = self._encoded.get(prompt)
        if ids is None:
            ids = self.tokenizer.encode(prompt, add_bos=self.add_bos)
            if len(self._encoded) >= self._CACHE:
                self._encoded.clear()
            self._encoded[prompt] = ids
        return ids

    def prompt_fits(self, prompt: str, max_new_tokens: int) -> bool:
        """Whether `prompt` (BOS included) fits the budget; what an agent renders against (`agent.render(s, fits)`)."""
        return len(self._encode(prompt)) <= self.prompt_budget(max_new_tokens)

    def encode_prompt(self, prompt: str, max_new_tokens: int) -> list[int]:
        """The prompt's token ids (one BOS). Over budget (the agent could not shorten it enough): the middle ids
        are dropped, keeping the first and the last half of the budget; counted in `prompts_cut`, warned once."""
        ids = self._encode(prompt)
        self._encoded.pop(prompt, None)
        limit = self.prompt_budget(max_new_tokens)
        if len(ids) > limit:
            self.prompts_cut += 1
            if self.prompts_cut == 1:
                log.warning("a prompt of %d tokens is over the budget of %d even as its agent rendered it: its middle "
                            "tokens are dropped; further ones are only counted in policy.prompts_cut", len(ids), limit)
            head = (limit + 1) // 2
            ids = ids[:head] + ids[len(ids) - (limit - head):]
        return ids

    @property
    def keeps_sessions(self) -> bool:
        return self.sessions is not None

    def release(self, keys) -> None:
        """Free the sessions `keys` (finished episodes)."""
        if self.sessions is not None:
            self.sessions.release(keys)

    def _sampling(self, temperature: float, max_new_tokens: int, stop_strings) -> SamplingParams:
        return SamplingParams(temperature=float(temperature), top_k=self.top_k, top_p=self.top_p,
                              max_new_tokens=max_new_tokens,
                              stop_ids=self.stop_token_ids(stop_strings) if self.device_stops else ())

    def continuous(self, slots: int, *, temperature=0.0, max_new_tokens=128, stop=None, seed=0,
                   chunk: int = 16, refill: float = 0.25, sessions: bool | None = None,
                   group: int = 1) -> "ContinuousSession":
        """A continuous-batching session: `slots` decode slots of `pool_tokens` tokens each (module doc); a decode
        chunk runs up to `chunk` steps and ends early once `refill` x slots more rows (in a grouped pool: whole
        groups) are done (SlotPool).
        sessions: keep KV sessions in the pool (default: the policy's pool_sessions). group: requests come `group`
        to a prompt; with the policy's cascade on, no prefix cache and slots a multiple of it, the pool keeps them in
        groups that read their prompt once (SlotPool(group=...); with sessions, a turn continues its picked
        branch into a group), else each slot holds a copy."""
        stop_strings = list(stop) if stop else None
        sessions = self.pool_sessions if sessions is None else sessions
        prefix_cache = self.prefix_cache and sessions
        group = group if self.cascade and group > 1 and not prefix_cache and slots % group == 0 else 1
        sp = self._sampling(temperature, max_new_tokens, stop_strings)
        spec = (slots, sp, tuple(stop_strings or ()), chunk, refill, sessions)
        if self.prefix_cache and sessions and self._pool is not None and self._pool_spec == spec \
                and not self._pool.busy:   # the last call's pool, its released rows cached: forks across calls
            self._pool.base_key = jax.random.PRNGKey(seed)
            return ContinuousSession(self, self._pool)
        pool = SlotPool(self.cfg, self._sample_params, slots, self.pool_tokens, sp, jax.random.PRNGKey(seed),
                        stop_strings=stop_strings, tokenizer=self.tokenizer, chunk=chunk, refill=refill,
                        setting="JaxPolicy(pool_tokens=...)", sessions=sessions, min_shared=self.min_shared,
                        prefix_cache=prefix_cache, group=group)
        if pool.prefix_cache:
            self._pool, self._pool_spec = pool, spec
        return ContinuousSession(self, pool)

    def generate(self, prompts, *, n=1, temperature=0.0, max_new_tokens=128, stop=None, seed=0, sessions=None):
        """sessions: one key per prompt (needs session_slots >= prompts x n): each prompt continues the KV cache of
        the key's branch (one per candidate of its last call) whose ids it extends; its n samples become the key's
        branches."""
        if not prompts:
            return []
        encoded = [self.encode_prompt(p, max_new_tokens) for p in prompts]
        stop_strings, key = (list(stop) if stop else None), jax.random.PRNGKey(seed)
        sp = self._sampling(temperature, max_new_tokens, stop_strings)
        if sessions is not None:
            if self.sessions is None or len(sessions) != len(prompts):
                raise ValueError(f"generate(sessions=...): needs a policy built with session_slots > 0 and one key "
                                 f"per prompt ({len(sessions)} keys, {len(prompts)} prompts)")
            out = sample_sessions(self.cfg, self._sample_params, self.sessions, list(sessions), encoded, sp, key,
                                  stop_strings=stop_strings, tokenizer=self.tokenizer, n=n, cascade=self.cascade)
        else:
            out = sample(self.cfg, self._sample_params, encoded, sp, key, stop_strings=stop_strings,
                         tokenizer=self.tokenizer, n=n, share_prefix=self.share_prefix, cascade=self.cascade,
                         min_rows=self.min_rows, min_prompt=self.min_prompt, layout=self.decode_layout)
        self.prefill_tokens += out.prefill_tokens
        self.decode_slots += out.decode_slots
        self.decode_tokens += int(out.lengths.sum())
        for k in self.timing:
            self.timing[k] += out.timing.get(k, 0.0)
        results: list[list[Completion]] = []
        for i, prompt_ids in enumerate(encoded):
            row = []
            for j in range(n):
                ids, logps = out.row(i * n + j)
                row.append(Completion(self.tokenizer.decode(ids), ids, logps, out.finish_reason[i * n + j], prompt_ids))
            results.append(row)
        return results


class ContinuousSession:
    """JaxPolicy's text-level view of a SlotPool: prompts are encoded as `generate` encodes them (one BOS, the
    prompt budget), completions decoded into `Completion`s; the policy's counters (prefill_tokens, decode_slots,
    decode_tokens, timing) grow as with `generate`."""

    def __init__(self, policy: JaxPolicy, pool: SlotPool):
        self.policy, self.pool = policy, pool
        self._last_stats, self._last_timing = collections.Counter(pool.stats), dict(pool.timing)   # a kept pool's

    @property
    def busy(self) -> int:
        return self.pool.busy

    @property
    def idle_share(self) -> float:
        """Slot-steps run with no live row in the slot / all slot-steps so far."""
        return self.pool.idle_share

    @property
    def keeps_sessions(self) -> bool:
        return self.pool.sessions

    def submit(self, rid, prompt: str, fold: tuple[int, int], session=None) -> None:
        """Queue `prompt` as request `rid`; its sampling key folds in `fold` (e.g. (episode index, step)).
        session: a key (e.g. the episode) whose last request's row this one continues (keeps_sessions)."""
        self.pool.submit(rid, self.policy.encode_prompt(prompt, self.pool.sp.max_new_tokens), fold, session)

    def release(self, keys) -> None:
        """Free the pool slots of sessions `keys` (finished episodes)."""
        self.pool.release(keys)

    def _count(self) -> None:
        """The pool's counters since the last call added to the policy's (prefill_tokens, decode_slots, timing;
        every SlotPool.stats counter to pool_stats)."""
        stats, timing = collections.Counter(self.pool.stats), dict(self.pool.timing)
        new, last = stats - self._last_stats, self._last_timing   # counters only grow
        self._last_stats, self._last_timing = stats, timing
        pol = self.policy
        pol.pool_stats.update(new)
        pol.prefill_tokens += new["prefill_tokens"]
        pol.decode_slots += new["slot_steps"]
        pol.timing["prefill_s"] += timing["insert_s"] - last["insert_s"]
        pol.timing["decode_s"] += timing["decode_s"] - last["decode_s"]

    def launch(self) -> bool:
        launched = self.pool.launch()
        self._count()
        return launched

    def collect(self) -> list[tuple[object, Completion]]:
        done = self.pool.collect()
        self._count()
        self.policy.decode_tokens += sum(len(f.tokens) for f in done)
        dec = self.policy.tokenizer.decode
        return [(f.rid, Completion(dec(f.tokens), f.tokens, f.logprobs, f.finish_reason, f.prompt_ids)) for f in done]

    def step(self) -> list[tuple[object, Completion]]:
        self.launch()
        return self.collect()
