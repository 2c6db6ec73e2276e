"""The loss table: every objective the trainer knows, in one place, and open.

A loss is an `Objective`, named in `train.loss` by its table name ("dpo") or, from any importable module, as
"module.path:attribute" (docs/ablations.md: SimPO in a file of its own). Each entry says:
  layout     the batch layout it trains on (jaxrag.train.batching: "sft" | "labeled" (single completions with a
             label each: KTO) | "pairs" | "groups" | "ppo")
  make       (mcfg, tc) -> loss_fn(trainable, frozen, batch, rng) -> loss or (loss, metrics)
  needs_ref  tc -> whether a frozen reference policy is kept (full fine-tune; with LoRA the base is the reference)
  needs_head whether a scalar critic/value head is trained with it
  prepare    (tc, batch) -> (batch, metrics): whole-batch quantities before microbatching (advantages, GAE)
  reads      what the loss reads of a row: "logprobs" (its completion tokens') or "last" (a head on its last token)
  options    defaults of its own settings, which `train.loss_opts` overrides (`loss_options(tc)`)
A paired loss computes on `pair_logps`, which gives every pair's sequence log-probs from the flat pair layout and
from its prefix tree alike, so it trains on both without a branch of its own; a loss on rows (sft, labeled) on
`row_logps`.

trainable: {"model": params} (full fine-tune) or {"lora": adapters}, plus {"head": critic/value head}.
frozen:    {"base": params} with LoRA (the reference = base, adapters off), {"ref": params} for a full fine-tune
           whose loss needs an online reference, else {}.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from jaxrag import losses
from jaxrag.models import critic_scores, forward_hidden
from jaxrag.models.transformer import constrain_rows, logits_from_hidden, row_devices
from jaxrag.models.lora import apply_lora
from jaxrag.stage_fn import resolve_attr


def policy_params(trainable, frozen, tc, rng):
    if "lora" in trainable:
        scale = tc.lora.alpha / tc.lora.rank
        return apply_lora(frozen["base"], trainable["lora"], scale, dropout=tc.lora.dropout, rng=rng)
    return trainable["model"]


def reference_params(trainable, frozen):
    ref = frozen.get("base", frozen.get("ref"))
    if ref is None:
        raise ValueError("this loss needs reference log-probs: put them in the batch or pass reference params")
    return jax.lax.stop_gradient(ref)


def sampled_logprobs(logits, tokens, temperature: float):
    """Token log-probs under the sampling distribution log_softmax(logits / T) (what sampling.generate records)."""
    return losses.token_logprobs(logits if temperature == 1.0 else logits / temperature, tokens)


def token_values(hidden, head):
    """Value head per token, aligned with token_logprobs: entry t = V(tokens[<t]) read from the hidden state at
    t-1 (the state in which token t was chosen); entry 0 = 0. hidden [B,T,D] -> [B,T] float32."""
    v = hidden.astype(jnp.float32) @ head["w"].astype(jnp.float32) + head["b"].astype(jnp.float32)
    return jnp.pad(v[:, :-1], ((0, 0), (1, 0)))


# [rows, V] float32 logits larger than this (entries; 512 MB) are computed chunk by chunk (`head_logprobs`)
MAX_LOGITS = 1 << 27


def head_logprobs(mcfg, params, hidden, tokens, temperature: float = 1.0, max_logits: int = MAX_LOGITS):
    """Token log-probs [B,T] (entry 0 = 0) from the final hidden states [B,T,D]: `sampled_logprobs` of the LM
    head's logits. When the [B,T,V] float32 logits would exceed `max_logits` entries (8 x 2,048 tokens x a 128k
    vocabulary: 8.4 GB), they are computed chunk by chunk of rows (`chunked_head_logprobs`): neither pass holds
    all the logits. The same values either way."""
    B, T, D = hidden.shape
    if B * T * mcfg.vocab_size <= max_logits:
        return sampled_logprobs(logits_from_hidden(mcfg, params, hidden), tokens, temperature)
    logp = picked_head_logprobs(mcfg, params, hidden[:, :-1].reshape(-1, D), tokens[:, 1:].reshape(-1), temperature,
                                max_logits)
    return jnp.pad(logp.reshape(B, T - 1), ((0, 0), (1, 0)))


def picked_head_logprobs(mcfg, params, h, targets, temperature: float = 1.0, max_logits: int = MAX_LOGITS):
    """log softmax(head(h) / temperature)[target] for h [N,D], targets [N] -> float32 [N]; past `max_logits`
    entries chunk by chunk of rows (`chunked_head_logprobs`)."""
    N, D = h.shape
    if N * mcfg.vocab_size <= max_logits:
        logits = logits_from_hidden(mcfg, params, h)
        return losses.picked_logprobs(logits if temperature == 1.0 else logits / temperature, targets)
    rows = max(1, max_logits // mcfg.vocab_size)
    dt = jnp.dtype(mcfg.dtype)
    n = -(-N // rows)
    pad = n * rows - N
    hc = jnp.pad(h.astype(dt), ((0, pad), (0, 0)))
    tgt = jnp.pad(targets, (0, pad))
    head = params["embed"].T if mcfg.tie_embeddings else params["lm_head"]
    if row_devices() == 1:
        return chunked_head_logprobs(hc.reshape(n, rows, D), head, tgt.reshape(n, rows), float(temperature),
                                     mcfg.matmul_precision).reshape(-1)[:N]
    # rows split over devices (a mesh in context): chunk c takes rows c, c + n, ..., so that each chunk's rows stay
    # split over the devices as h's are (contiguous chunks would move every hidden state to another device)
    hc = constrain_rows(hc.reshape(rows, n, D).swapaxes(0, 1), dim=1)
    logp = chunked_head_logprobs(hc, head, tgt.reshape(rows, n).T, float(temperature), mcfg.matmul_precision)
    return logp.T.reshape(-1)[:N]


# ------------------------------------------------------------------------ the prefix-tree layout's reads
def is_tree(batch) -> bool:
    """A prefix-tree batch (jaxrag.train.prefix_tree): packs [P,L] with `tree_exit`, the loss read at [P,M] reads."""
    return "tree_exit" in batch


def tree_hidden(mcfg, tc, p, batch):
    """Final hidden states [P,L,D] of a prefix-tree batch (each token attends to its ancestors)."""
    return forward_hidden(mcfg, p, batch["tokens"], batch["positions"], batch["segment_ids"], remat=bool(tc.remat),
                          tree_exit=batch["tree_exit"])


def read_hidden(hidden, read_pos):
    """hidden [P,L,D] at the reads read_pos [P,M] -> [P,M,D]: the state each read's target was chosen in."""
    return jnp.take_along_axis(hidden, read_pos[..., None], axis=1)


def read_logprobs(mcfg, params, hidden, batch, temperature: float = 1.0):
    """Log-probs [P,M] of each read's target at its position (the row's previous token)."""
    h = read_hidden(hidden, batch["read_pos"])
    P, M, D = h.shape
    return picked_head_logprobs(mcfg, params, h.reshape(-1, D), batch["read_target"].reshape(-1),
                                temperature).reshape(P, M)


def read_values(hidden, batch, head):
    """The value head at each read [P,M]: V of the state the read's target was chosen in (token_values' rule)."""
    h = read_hidden(hidden, batch["read_pos"]).astype(jnp.float32)
    return h @ head["w"].astype(jnp.float32) + head["b"].astype(jnp.float32)


def _chunk_logits(hc, w, temperature, precision):
    logits = jnp.dot(hc, w, precision=precision, preferred_element_type=jnp.float32)
    return logits if temperature == 1.0 else logits / temperature


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def chunked_head_logprobs(h, w, tgt, temperature, precision):
    """log softmax(h @ w / temperature)[tgt], one chunk of rows at a time: h [n,rows,D] in the compute dtype, w
    [D,V] the parameter (cast to h's dtype once a pass), tgt [n,rows] -> float32 [n,rows]. The forward keeps each
    row's logsumexp (and no cast copy of w); the backward recomputes one chunk's logits, forms its gradient
    (one-hot - softmax) in float32, casts it to the compute dtype for both GEMMs (autocast's rule; a no-op in
    float32) and, when w is trained, sums its gradient over the chunks in float32, returned in w's dtype."""
    return _chunked_logp(h, w, tgt, temperature, precision)[0]


def _chunked_logp(h, w, tgt, temperature, precision):
    w = w.astype(h.dtype)

    def one(xs):
        hc, tc = xs
        logits = _chunk_logits(hc, w, temperature, precision)
        lse = jax.nn.logsumexp(logits, axis=-1)
        return jnp.take_along_axis(logits, tc[:, None], axis=-1)[:, 0] - lse, lse

    return jax.lax.map(one, (h, tgt))


def _chunked_fwd(h, w, tgt, temperature, precision):  # symbolic zeros: inputs come as CustomVJPPrimal
    logp, lse = _chunked_logp(h.value, w.value, tgt.value, temperature, precision)
    return logp, (h.value, w.value, tgt.value, lse, () if w.perturbed else None)


def _chunked_bwd(temperature, precision, res, g):
    """h's gradient always; w's only when w is trained (a frozen LoRA base head gets no [D,V] GEMMs)."""
    h, w_param, tgt, lse, want_w = res
    if isinstance(g, SymbolicZero):
        return None, None, None
    w = w_param.astype(h.dtype)

    def one(dw, xs):
        hc, tc, lc, gc = xs
        probs = jnp.exp(_chunk_logits(hc, w, temperature, precision) - lc[:, None])
        d = ((jax.nn.one_hot(tc, w.shape[1], dtype=jnp.float32) - probs) * (gc / temperature)[:, None]).astype(h.dtype)
        dh = jnp.dot(d, w.T, precision=precision, preferred_element_type=jnp.float32).astype(h.dtype)
        if dw is not None:
            dw = dw + jnp.dot(hc.T, d, precision=precision, preferred_element_type=jnp.float32)
        return dw, dh

    dw, dh = jax.lax.scan(one, None if want_w is None else jnp.zeros(w.shape, jnp.float32), (h, tgt, lse, g))
    return dh, None if dw is None else dw.astype(w_param.dtype), None


chunked_head_logprobs.defvjp(_chunked_fwd, _chunked_bwd, symbolic_zeros=True)


def make_score_fn(mcfg, tc) -> Callable:
    """(trainable, frozen, batch) -> (logp[B,T] at train.sampling_temperature, values[B,T] or None): the policy's
    own log-probs and (ppo) value estimates of a batch, computed exactly as the grpo/ppo losses compute them
    (a prefix-tree batch: [P,M], one per read)."""

    def score(trainable, frozen, batch):
        tok, pos, seg = (batch[k] for k in ("tokens", "positions", "segment_ids"))
        p = policy_params(trainable, frozen, tc, None)
        if is_tree(batch):   # [P,M] at the reads
            hidden = tree_hidden(mcfg, tc, p, batch)
            values = read_values(hidden, batch, trainable["head"]) if "head" in trainable else None
            return read_logprobs(mcfg, p, hidden, batch, tc.sampling_temperature), values
        hidden = forward_hidden(mcfg, p, tok, pos, seg)
        values = token_values(hidden, trainable["head"]) if "head" in trainable else None
        return head_logprobs(mcfg, p, hidden, tok, tc.sampling_temperature), values

    return score


def _logp(mcfg, tc, temperature: float = 1.0):
    """(params, tokens, positions, segment_ids) -> token log-probs [B,T] at `temperature` (see head_logprobs)."""
    return lambda p, tok, pos, seg: head_logprobs(mcfg, p, forward_hidden(mcfg, p, tok, pos, seg, remat=bool(tc.remat)),
                                                  tok, temperature)


def _ratio_max_dev(logp, old, mask):  # max |π/π_old - 1| over action tokens: 0 on the first inner step
    return jnp.max(jnp.abs(jnp.exp(jax.lax.stop_gradient(logp) - old) - 1.0) * mask)


def _flat(batch, keys=("tokens", "positions", "segment_ids", "loss_mask")):
    """[B,2,T] pair layout -> [2B,T] (row 2i chosen, 2i+1 rejected)."""
    return [batch[k].reshape(-1, batch[k].shape[-1]) for k in keys]


# ------------------------------------------------------------------------------------------------ the losses
def sft_objective(mcfg, tc):
    logp_of = _logp(mcfg, tc)

    def sft(trainable, frozen, batch, rng):
        p = policy_params(trainable, frozen, tc, rng)
        logp = logp_of(p, batch["tokens"], batch["positions"], batch["segment_ids"])
        return losses.sft_loss(logp, batch["loss_mask"], tc.sft.reduction)

    return sft


def row_logps(mcfg, tc):
    """The sft and labeled layouts' adaptor: (params, batch) -> (seq [B], lengths [B]): each row's completion
    log-prob sum and its token count (loss_mask)."""
    logp_of = _logp(mcfg, tc)

    def of(p, batch):
        mask = batch["loss_mask"]
        logp = logp_of(p, batch["tokens"], batch["positions"], batch["segment_ids"])
        return losses.sequence_logprobs(logp, mask), jnp.sum(mask, axis=-1)

    return of


def pair_logps(mcfg, tc):
    """The pairs layout's adaptor: (params, batch) -> (seq, lengths, weight). seq [N, 2]: each pair's chosen
    (column 0) and rejected (column 1) completion log-prob sums; lengths [N, 2]: their token counts; weight [N]: the
    pairs' weights (the prefix tree's pair_weight: summing to 1 over the whole batch, 0 on its padding pairs) or None
    for the flat [B, 2, T] layout, whose pairs all count. A paired loss written on these, averaging with
    `pair_mean(weight)`, trains on either layout and over microbatches exactly."""
    logp_of = _logp(mcfg, tc)

    def of(p, batch):
        if is_tree(batch):   # per-pack segment sums of the reads
            mask = batch["loss_mask"]
            logp = read_logprobs(mcfg, p, tree_hidden(mcfg, tc, p, batch), batch) * mask
            Q = batch["pair_weight"].shape[1]
            seg_sum = jax.vmap(lambda x, i: jax.ops.segment_sum(x, i, 2 * Q))
            return (seg_sum(logp, batch["read_seq"]).reshape(-1, 2),
                    seg_sum(mask, batch["read_seq"]).reshape(-1, 2), batch["pair_weight"].reshape(-1))
        tok, pos, seg, mask = _flat(batch)
        seq = losses.sequence_logprobs(logp_of(p, tok, pos, seg), mask).reshape(-1, 2)
        return seq, jnp.sum(mask, axis=-1).reshape(-1, 2), None

    return of


def pair_mean(weight):
    """The mean over a batch's pairs of a per-pair quantity [N]: plain for the flat layout (weight None), the
    weighted sum for the prefix tree's."""
    if weight is None:
        return jnp.mean
    w = jax.lax.stop_gradient(weight)
    return lambda x: jnp.sum(w * x)


def dpo_objective(mcfg, tc):
    logps = pair_logps(mcfg, tc)

    def dpo(trainable, frozen, batch, rng):
        seq, _, weight = logps(policy_params(trainable, frozen, tc, rng), batch)
        if "ref_logps" in batch:   # precomputed by the caller (flat layout)
            ref = batch["ref_logps"]
        else:
            ref, _, _ = logps(reference_params(trainable, frozen), batch)
        return losses.dpo_loss(seq[:, 0], seq[:, 1], ref[:, 0], ref[:, 1], tc.dpo.beta, tc.dpo.label_smoothing,
                               tc.dpo.loss_type, weight)

    return dpo


def bt_objective(mcfg, tc):
    def bt(trainable, frozen, batch, rng):
        p = policy_params(trainable, frozen, tc, rng)
        if is_tree(batch):   # each row's last token in its pack (prefix_tree.pair_tree_batch's pair_last [P,Q,2])
            P, Q, _ = batch["pair_last"].shape
            h = read_hidden(tree_hidden(mcfg, tc, p, batch), batch["pair_last"].reshape(P, 2 * Q))
            head = trainable["head"]
            scores = (h.astype(jnp.float32) @ head["w"] + head["b"]).reshape(-1, 2)
            return losses.bradley_terry_loss(scores[:, 0], scores[:, 1], tc.bt.center_coef,
                                             batch["pair_weight"].reshape(-1))
        tok, pos, seg = _flat(batch, ("tokens", "positions", "segment_ids"))
        scores = critic_scores(mcfg, p, trainable["head"], tok, pos, seg, batch["read_index"].reshape(-1),
                               remat=bool(tc.remat))
        scores = scores.reshape(-1, 2)
        return losses.bradley_terry_loss(scores[:, 0], scores[:, 1], tc.bt.center_coef)

    return bt


def grpo_objective(mcfg, tc):
    logp_of = _logp(mcfg, tc, float(tc.sampling_temperature))

    temp = float(tc.sampling_temperature)
    tree_logp = lambda p, batch: read_logprobs(mcfg, p, tree_hidden(mcfg, tc, p, batch), batch, temp)

    def grpo(trainable, frozen, batch, rng):
        tok, pos, seg, mask = (batch[k] for k in ("tokens", "positions", "segment_ids", "loss_mask"))
        p = policy_params(trainable, frozen, tc, rng)
        tree = is_tree(batch)
        of = (lambda q: tree_logp(q, batch)) if tree else (lambda q: logp_of(q, tok, pos, seg))
        logp = of(p)
        old = batch["old_logp"] if "old_logp" in batch else jax.lax.stop_gradient(logp)
        if "ref_logp" in batch:
            ref = batch["ref_logp"]
        elif tc.grpo.beta == 0:
            ref = jax.lax.stop_gradient(logp)
        else:
            ref = of(reference_params(trainable, frozen))
        adv, weight = batch["advantages"], batch.get("token_weight")
        if tree:   # reads [P,M], each with its row's advantage and weight: as [P*M] rows of one token
            logp, old, ref, mask, weight = (x.reshape(-1, 1) for x in (logp, old, ref, mask, weight))
            adv = adv.reshape(-1)
        clamp = tc.grpo.kl_clamp if tc.grpo.kl_clamp > 0 else None
        loss, m = losses.grpo_loss(logp, old, ref, mask, adv, tc.grpo.clip_eps, tc.grpo.beta,
                                   tc.grpo.kl_estimator, tc.grpo.aggregation, clamp, weight)
        m["ratio_max_dev"] = _ratio_max_dev(logp, old, mask)
        return loss, m

    return grpo


def ppo_objective(mcfg, tc):
    temp = float(tc.sampling_temperature)

    def ppo(trainable, frozen, batch, rng):
        tok, pos, seg, mask = (batch[k] for k in ("tokens", "positions", "segment_ids", "loss_mask"))
        p = policy_params(trainable, frozen, tc, rng)
        if is_tree(batch):   # reads [P,M] as [P*M] rows of one token (token_weight: from jaxrag.rl, always)
            hidden = tree_hidden(mcfg, tc, p, batch)
            values = read_values(hidden, batch, trainable["head"]).reshape(-1, 1)
            logp = read_logprobs(mcfg, p, hidden, batch, temp).reshape(-1, 1)
            batch = {k: batch[k].reshape(-1, 1) for k in ("loss_mask", "old_logp", "advantages", "old_values",
                                                           "returns", "token_weight")}
            mask = batch["loss_mask"]
        else:
            hidden = forward_hidden(mcfg, p, tok, pos, seg, remat=bool(tc.remat))
            values = token_values(hidden, trainable["head"])
            logp = head_logprobs(mcfg, p, hidden, tok, temp)
        # batches with token_weight come from jaxrag.rl, which whitens advantages over the whole batch itself
        whiten = tc.ppo.whiten and "token_weight" not in batch
        loss, m = losses.ppo_loss(logp, batch["old_logp"], mask, batch["advantages"], values, batch["old_values"],
                                  batch["returns"], tc.ppo.clip_eps, tc.ppo.value_clip_eps, tc.ppo.vf_coef, whiten,
                                  batch.get("token_weight"))
        for name in losses.KL_ESTIMATORS:  # drift from the behaviour policy, every estimator
            m[f"kl/{name}"] = losses._masked_mean(
                jax.lax.stop_gradient(losses.kl_penalty(logp, batch["old_logp"], name)), mask)
        m["ratio_max_dev"] = _ratio_max_dev(logp, batch["old_logp"], mask)
        return loss, m

    return ppo


# ------------------------------------------------------------------------------------- whole-batch preparation
def grpo_prepare(tc, batch):
    """Group-normalized advantages from per-row rewards, unless the batch brings its own (the RL loop)."""
    if "advantages" in batch:
        return batch, {}
    r = batch["rewards"]
    adv = losses.group_advantages(r, tc.grpo.group_size, tc.grpo.adv_eps, tc.grpo.std_ddof)
    return {**batch, "advantages": adv}, {"reward/mean": jnp.mean(r), "reward/std": jnp.std(r)}


def ppo_prepare(tc, batch):
    """GAE over per-token rewards, unless the batch brings its own advantages and returns (the RL loop)."""
    if "advantages" in batch:
        return batch, {}
    adv, ret = losses.gae(batch["rewards"], batch["old_values"], batch["loss_mask"], tc.ppo.gamma, tc.ppo.lam)
    per_seq = jnp.sum(batch["rewards"], axis=-1)
    return {**batch, "advantages": adv, "returns": ret}, {"reward/mean": jnp.mean(per_seq), "reward/std": jnp.std(per_seq)}


# ---------------------------------------------------------------------------------------------------- the table
LAYOUTS = ("sft", "labeled", "pairs", "groups", "ppo")


@dataclasses.dataclass(frozen=True)
class Objective:
    """One loss of the table (the module doc says what each field means)."""
    name: str
    layout: str
    make: Callable
    needs_ref: Callable = lambda tc: False
    needs_head: bool = False
    prepare: Callable | None = None
    reads: str = "logprobs"
    options: dict = dataclasses.field(default_factory=dict)


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("sft", "sft", sft_objective),
    Objective("dpo", "pairs", dpo_objective, needs_ref=lambda tc: True),
    Objective("bt", "pairs", bt_objective, needs_head=True, reads="last"),
    Objective("grpo", "groups", grpo_objective, needs_ref=lambda tc: tc.grpo.beta > 0, prepare=grpo_prepare),
    Objective("ppo", "ppo", ppo_objective, needs_head=True, prepare=ppo_prepare),
)}


def get(name: str, where: str = "train config: loss") -> Objective:
    """The Objective a `train.loss` value names: a table entry, or "module.path:attribute" (any importable module
    whose attribute is an Objective). Errors are one line naming `where`."""
    if name in OBJECTIVES:
        return OBJECTIVES[name]
    if not isinstance(name, str) or ":" not in name:
        raise ValueError(f"{where}: {name!r} is not one of {tuple(OBJECTIVES)} or 'module.path:attribute' (an "
                         "Objective of your own: docs/ablations.md)")
    obj = resolve_attr(name, where, "Objective", lambda x: isinstance(x, Objective))
    if obj.layout not in LAYOUTS or obj.reads not in ("logprobs", "last"):
        raise ValueError(f"{where}: {name!r}: layout {obj.layout!r} / reads {obj.reads!r} (layouts: {LAYOUTS}; "
                         "reads: 'logprobs' or 'last')")
    return obj


def objective(tc) -> Objective:
    return get(tc.loss)


def loss_options(tc) -> dict:
    """The loss's own settings: its `options` defaults updated by `train.loss_opts`; a key it does not have is an
    error naming it."""
    obj, given = objective(tc), dict(tc.get("loss_opts") or {})
    unknown = sorted(set(given) - set(obj.options))
    if unknown:
        raise ValueError(f"train config: loss_opts.{unknown[0]}: not a setting of loss {tc.loss!r} (its settings: "
                         f"{', '.join(obj.options) or 'none'})")
    return {**obj.options, **given}


def make_loss_fn(mcfg, tc) -> Callable:
    return objective(tc).make(mcfg, tc)


def make_prepare(tc) -> Callable:
    """Whole-batch quantities computed before microbatching -> (batch, metrics). "token_weight" (aggregation weights
    normalized over the whole batch, from the RL loop) is scaled by grad_accum, since the step averages the
    microbatch gradients: the accumulated gradient then equals the full-batch gradient exactly."""
    obj, accum = objective(tc), int(tc.grad_accum)

    def prepare(batch):
        batch, m = obj.prepare(tc, batch) if obj.prepare is not None else (batch, {})
        for key in ("token_weight", "pair_weight"):   # whole-batch weights (pair_weight: prefix-tree DPO)
            if key in batch and accum > 1:
                batch = {**batch, key: batch[key] * accum}
        return batch, m

    return prepare
