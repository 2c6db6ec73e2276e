"""The prefix-tree training layout (jaxrag.train.prefix_tree): packing round-trips, the mask is the ancestor
relation, and losses and gradients equal the per-row layout's (GRPO groups, multi-turn episodes whose prompts do
not extend each other, DPO pairs, PPO), for every aggregation; the auto choice."""

import functools

import jax
import numpy as np
import pytest

from jaxrag.losses import GRPO_AGGREGATIONS
from jaxrag.env.mdp import Action, Episode, Step
from jaxrag.models import ModelConfig, critic_init, forward_hidden, init_params
from jaxrag.models.transformer import tree_mask
from jaxrag.rl import rows as R
from jaxrag.train import config as tconfig
from jaxrag.train import prefix_tree as PT
from jaxrag.train.batching import PreferencePair, pair_batch
from jaxrag.train.objectives import make_score_fn
from jaxrag.train.steps import make_grad_fn

CFG = ModelConfig(model_type="llama", vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16,
                  d_ff=64)


def ids(rng, n):
    return [int(x) for x in rng.integers(3, 64, n)]


def rag_gym_episodes(rng, questions=2, group=3, turns=3):
    """RAG-Gym-style episodes: each turn's prompt is the system text + the history so far + the question (after
    the history), so a turn's prompt does not extend the last one's ids; the G episodes of a question share their
    first prompt, and episodes 0 and 1 of each group sample the same first action (a duplicate row)."""
    eps = []
    for q in range(questions):
        system, question, first = ids(rng, 7), ids(rng, 4), ids(rng, 3)
        for g in range(group):
            history, steps = [], []
            for t in range(turns):
                prompt = system + history + [1] + question
                gen = list(first) if (t == 0 and g < 2) else ids(rng, int(rng.integers(1, 5)))
                steps.append(Step(action=Action("query", "q"), prompt_ids=prompt, token_ids=gen,
                                  logprobs=list(rng.normal(-3.0, 0.5, len(gen)))))
                history = history + gen + ids(rng, 3)
            eps.append(Episode(qid=f"q{q}", question="", gold=[], steps=steps))
    return eps


def append_only_episodes(rng, questions=2, group=2, turns=3):
    """Search-R1-style episodes: each next prompt is the last prompt + the action + the observation."""
    eps = []
    for q in range(questions):
        first = ids(rng, 6)
        for g in range(group):
            prompt, steps = list(first), []
            for t in range(turns):
                gen = ids(rng, int(rng.integers(1, 5)))
                steps.append(Step(action=Action("query", "q"), prompt_ids=list(prompt), token_ids=gen,
                                  logprobs=list(rng.normal(-3.0, 0.5, len(gen)))))
                prompt = prompt + gen + ids(rng, 3)
            eps.append(Episode(qid=f"q{q}", question="", gold=[], steps=steps))
    return eps


@functools.lru_cache
def grads_fn(loss="grpo"):
    """The jitted gradient; every batch brings token_weight, so one compiled step serves every aggregation."""
    tc = tconfig.resolve({"loss": loss, "batch_size": 6, "sampling_temperature": 0.9,
                          "grpo": {"group_size": 3, "beta": 0.04, "clip_eps": 0.2}})
    return jax.jit(make_grad_fn(CFG, tc))


def model_args():
    params = init_params(CFG, jax.random.PRNGKey(0), std=0.3)
    return {"model": params}, {"ref": jax.tree.map(lambda x: x * 1.05, params)}


def assert_same(a, b, rtol=1e-4, atol=1e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=rtol)


# ------------------------------------------------------------------------------------------------ packing
def test_packing_round_trips_every_row():
    rows = R.action_rows(rag_gym_episodes(np.random.default_rng(0)))
    seqs = [r.prompt + r.completion for r in rows]
    for length in (max(map(len, seqs)), 256):
        t = PT.pack_tree(R.tree_inputs(rows), length)
        for r, s in enumerate(seqs):
            p, idx = t.row_pack[r], t.row_index[r]
            np.testing.assert_array_equal(t.tokens[p, idx], s)
            np.testing.assert_array_equal(t.positions[p, idx], np.arange(len(s)))   # per-path positions
            assert (t.segment_ids[p, idx] == 1).all()
            # each read: position of the previous token of the row, target its generated token
            slots = t.row_reads[r]
            np.testing.assert_array_equal(t.read_pos[p, slots], idx[len(rows[r].prompt) - 1:-1])
            np.testing.assert_array_equal(t.read_target[p, slots], rows[r].completion)
        assert t.read_valid.sum() == sum(len(r.completion) for r in rows)   # duplicates keep their own reads
    one = PT.pack_tree(R.tree_inputs(rows), 256)
    assert one.segment_ids.sum() == PT.distinct_tokens(seqs) < sum(map(len, seqs))
    with pytest.raises(ValueError, match="row 0 has 4 tokens, more than the pack length 3"):
        PT.pack_tree([([1, 2], [3, 4], None)], 3)


def test_a_batch_shape_follows_the_pack_length_and_count_only():
    """The read slots per pack are fixed by the pack length (a pack closes when its reads would pass them), so two
    steps whose rows differ compile the same shape whenever they need as many packs; pack counts take two sizes per
    octave."""
    rng = np.random.default_rng(5)
    few = [(ids(rng, 40), ids(rng, 3), None) for _ in range(6)]       # 18 reads
    many = [(ids(rng, 10), ids(rng, 30), None) for _ in range(2)]     # 60 reads, in one pack by tokens
    a, b = PT.pack_tree(few, 512), PT.pack_tree(many, 512)
    assert a.read_pos.shape[1] == b.read_pos.shape[1] == PT.read_bucket(256)
    two = [(ids(rng, 10), ids(rng, 20), None) for _ in range(2)]
    assert PT.pack_tree(two, 64, pack_multiple=1).read_pos.shape[1] == 32
    c = PT.pack_tree(two, 64)   # 60 tokens fit one pack of 64, but 40 reads do not fit its 32 read slots
    assert len(set(c.row_pack.tolist())) == 2 and (c.read_valid.sum(axis=1) <= 32).all()
    assert c.read_valid.sum() == 40 and PT.pack_tree(two, 128).row_pack.tolist() == [0, 0]   # 64 slots: one pack
    big = PT.pack_tree([(ids(rng, 4), ids(rng, 50), None)], 64)   # one row over the cap: its reads set M
    assert big.read_pos.shape[1] == 64
    assert [PT.pack_bucket(n) for n in (1, 3, 5, 7, 9, 13, 17)] == [1, 3, 6, 8, 12, 16, 24]
    assert PT.pack_bucket(5, 4) == 8


def test_mask_is_the_ancestor_relation():
    rows = R.action_rows(rag_gym_episodes(np.random.default_rng(1)))
    t = PT.pack_tree(R.tree_inputs(rows), 128)
    mask = np.asarray(tree_mask(t.tree_exit))
    P, L = t.tokens.shape
    want = np.zeros((P, L, L), bool)
    for r, idx in enumerate(t.row_index):   # j visible to i iff j lies on a path through i, at or above it
        for d in range(len(idx)):
            want[t.row_pack[r], idx[d], idx[:d + 1]] = True
    pad = t.segment_ids == 0
    want[np.nonzero(pad)[0], np.nonzero(pad)[1], np.nonzero(pad)[1]] = True   # padding sees itself only
    np.testing.assert_array_equal(mask, want)


def test_tree_hidden_states_equal_the_rows():
    """The forward over packs gives each row's token the hidden state of the per-row layout (the same ancestors,
    the same positions)."""
    rows = R.action_rows(rag_gym_episodes(np.random.default_rng(2)))
    params = init_params(CFG, jax.random.PRNGKey(0), std=0.3)
    t = PT.pack_tree(R.tree_inputs(rows), 64)
    tree_h = np.asarray(forward_hidden(CFG, params, t.tokens, t.positions, t.segment_ids, tree_exit=t.tree_exit))
    b = R.pack(rows, (64,))
    row_h = np.asarray(forward_hidden(CFG, params, b["tokens"], b["positions"], b["segment_ids"]))
    for r, idx in enumerate(t.row_index):
        np.testing.assert_allclose(tree_h[t.row_pack[r], idx], row_h[r, :len(idx)], atol=2e-5, rtol=1e-4)


# ------------------------------------------------------------------------------------------------ GRPO
def test_grpo_tree_equals_rows():
    """GRPO groups (G episodes sharing the first prompt, a duplicate first action in each group) over multi-turn
    episodes whose prompts do not extend each other: the same loss, metrics and gradient as one row per action,
    in one pack and in several."""
    eps = rag_gym_episodes(np.random.default_rng(3))
    rows = R.action_rows(eps)
    adv = R.group_advantages(eps, [1.0, 0.0, 0.5, 2.0, -1.0, 0.3], 3)
    args = model_args()
    fn = grads_fn()
    longest = max(len(r.prompt) + len(r.completion) for r in rows)
    for aggregation, length in (("token_mean", 256), ("seq_mean_token_mean", longest),
                                ("seq_mean_token_sum_norm", 256), ("seq_mean_token_sum_norm", longest)):
        g_r, m_r = fn(*args, R.grpo_batch(rows, adv, aggregation, 16, (64,)), jax.random.PRNGKey(0))
        assert float(m_r["clip_fraction"]) > 0 and float(m_r["kl/k2"]) > 0   # every term of the loss is in play
        tree = PT.pack_tree(R.tree_inputs(rows), length)
        assert (tree.row_pack.max() > 0) == (length == longest)
        g_t, m_t = fn(*args, R.grpo_tree_batch(rows, adv, aggregation, 16, tree), jax.random.PRNGKey(0))
        for k in ("loss", "clip_fraction", "kl/k1", "kl/k2", "kl/k3", "ratio_max_dev"):
            np.testing.assert_allclose(float(m_t[k]), float(m_r[k]), rtol=1e-5, atol=1e-7)
        assert_same(g_t, g_r)


def test_grpo_tree_equals_merged_rows_append_only():
    """An append-only format: merged rows (rows.merge_turns) and the tree over the per-action rows agree."""
    eps = append_only_episodes(np.random.default_rng(4))
    adv = R.group_advantages(eps, [1.0, 0.0, 0.5, 2.0], 2)
    per_action = R.action_rows(eps)
    merged = R.merge_turns(per_action)
    assert len(merged) == 4
    args = model_args()
    fn = grads_fn()
    g_r, m_r = fn(*args, R.grpo_batch(merged, adv, "seq_mean_token_mean", 16, (64,)), jax.random.PRNGKey(0))
    tree = PT.pack_tree(R.tree_inputs(per_action), 128)
    assert tree.segment_ids.sum() == PT.distinct_tokens([r.prompt + r.completion for r in merged])
    g_t, m_t = fn(*args, R.grpo_tree_batch(per_action, adv, "seq_mean_token_mean", 16, tree), jax.random.PRNGKey(0))
    np.testing.assert_allclose(float(m_t["loss"]), float(m_r["loss"]), rtol=1e-5)
    assert_same(g_t, g_r)


# ------------------------------------------------------------------------------------------------ DPO
def dpo_pairs(rng, states=3, per_state=2):
    """Pairs whose chosen and rejected share the state prompt; each state has several pairs, and a chosen and its
    rejected share their first completion tokens."""
    out = []
    for _ in range(states):
        prompt = ids(rng, 12)
        for _ in range(per_state):
            head = ids(rng, 2)
            out.append(PreferencePair(prompt, head + ids(rng, 3), head + ids(rng, int(rng.integers(1, 5)))))
    return out


@functools.lru_cache
def dpo_grads(accum):
    tc = tconfig.resolve({"loss": "dpo", "batch_size": 6, "grad_accum": accum,
                          "dpo": {"beta": 0.5, "label_smoothing": 0.1}})
    return jax.jit(make_grad_fn(CFG, tc))


def test_dpo_pairs_tree_equals_rows():
    """DPO pairs sharing the state prompt: the same loss, metrics and gradient in one pack and in several packs
    split over 2 microbatches (pair_weight keeps the mean over all pairs exact)."""
    pairs = dpo_pairs(np.random.default_rng(5))
    args = model_args()
    g_r, m_r = dpo_grads(1)(*args, pair_batch(pairs, (32,)), jax.random.PRNGKey(0))
    for accum, length, multiple in ((1, 128, 1), (2, 32, 2)):
        b = PT.pair_batch_auto(pairs, (length,), CFG, "tree", pack_multiple=multiple)
        assert "tree_exit" in b and (b["tokens"].shape[0] > 1) == (accum == 2)
        g_t, m_t = dpo_grads(accum)(*args, b, jax.random.PRNGKey(0))
        for k in ("loss", "dpo/reward_margin", "dpo/accuracy"):
            np.testing.assert_allclose(float(m_t[k]), float(m_r[k]), rtol=1e-5, atol=1e-7)
        assert_same(g_t, g_r)
    assert PT.pair_batch_auto(pairs, (32,), CFG, "rows")["tokens"].shape == (6, 2, 32)


@functools.lru_cache
def bt_grads(accum):
    tc = tconfig.resolve({"loss": "bt", "batch_size": 6, "grad_accum": accum, "bt": {"center_coef": 0.01}})
    return jax.jit(make_grad_fn(CFG, tc))


def test_critic_pairs_tree_equals_rows():
    """Bradley-Terry pairs sharing the state prompt: each row's score read at its last token in the pack; the same
    loss, metrics and gradient (backbone and head) as the per-row layout in one pack and over 2 microbatches."""
    pairs = dpo_pairs(np.random.default_rng(8))
    pairs.append(PreferencePair(pairs[0].prompt, pairs[0].chosen, pairs[0].chosen[:2]))  # rejected: a prefix of chosen
    params = init_params(CFG, jax.random.PRNGKey(0), std=0.3)
    args = {"model": params, "head": critic_init(CFG, jax.random.PRNGKey(1))}, {}
    g_r, m_r = bt_grads(1)(*args, pair_batch(pairs, (32,)), jax.random.PRNGKey(0))
    for accum, length, multiple in ((1, 128, 1), (2, 32, 2)):
        b = PT.pair_batch_auto(pairs, (length,), CFG, "tree", pack_multiple=multiple, reads="last")
        assert "tree_exit" in b and (b["tokens"].shape[0] > 1) == (accum == 2)
        assert not b["loss_mask"].any()   # no log-prob reads: the critic reads last tokens
        g_t, m_t = bt_grads(accum)(*args, b, jax.random.PRNGKey(0))
        for k in ("loss", "bt/margin", "bt/accuracy", "bt/score_mean"):
            np.testing.assert_allclose(float(m_t[k]), float(m_r[k]), rtol=1e-5, atol=1e-6)
        assert_same(g_t, g_r)
    # the critic's cost has no LM head: auto weighs layers and attention (here the shared prompts win)
    assert "tree_exit" in PT.pair_batch_auto(pairs, (32,), CFG, "auto", reads="last")
    with pytest.raises(ValueError, match="reads 'values' is not 'logprobs' or 'last'"):
        PT.pair_batch_auto(pairs, (32,), CFG, "tree", reads="values")


# ------------------------------------------------------------------------------------------------ PPO
def test_ppo_tree_equals_rows():
    """PPO over RAG-Gym episodes: the value head read at the tree's reads equals the per-row values; GAE, whitening
    and the loss's gradient (policy and value head) are the per-row layout's."""
    eps = rag_gym_episodes(np.random.default_rng(6))
    rows = R.action_rows(eps)
    outcome = [1.0, 0.0, 0.5, 2.0, -1.0, 0.3]
    tc = tconfig.resolve({"loss": "ppo", "batch_size": 6, "sampling_temperature": 0.9})
    params = init_params(CFG, jax.random.PRNGKey(0), std=0.3)
    trainable = {"model": params, "head": critic_init(CFG, jax.random.PRNGKey(1))}
    score = jax.jit(make_score_fn(CFG, tc))
    packed = R.pack(rows, (64,))
    v_rows = np.asarray(score(trainable, {}, {k: packed[k] for k in ("tokens", "positions", "segment_ids")})[1])
    b_rows = R.ppo_batch(rows, packed, v_rows, outcome, None, 1.0, 0.95, True)
    tree = PT.pack_tree(R.tree_inputs(rows), 128)
    v_tree = np.asarray(score(trainable, {}, tree.arrays())[1])
    for r, v in enumerate(tree.gather(v_tree)):
        p = len(rows[r].prompt)
        np.testing.assert_allclose(v, v_rows[r, p:p + len(v)], atol=1e-5, rtol=1e-4)
    b_tree = R.ppo_tree_batch(rows, tree, v_tree, outcome, None, 1.0, 0.95, True)
    fn = jax.jit(make_grad_fn(CFG, tc))
    g_r, m_r = fn(trainable, {}, b_rows, jax.random.PRNGKey(0))
    g_t, m_t = fn(trainable, {}, b_tree, jax.random.PRNGKey(0))
    for k in ("loss", "ppo/pg_loss", "ppo/vf_loss", "kl/k3"):
        np.testing.assert_allclose(float(m_t[k]), float(m_r[k]), rtol=1e-4, atol=1e-6)
    assert_same(g_t, g_r, rtol=1e-4, atol=2e-5)


# ------------------------------------------------------------------------------------------------ choice
def test_auto_picks_the_tree_where_it_saves_work():
    """G = 8 episodes sharing a long first prompt with short actions: the tree; rows that share nothing: the rows
    (the tree would only add packing); forced modes are obeyed; the RL loop's choice records its numbers."""
    rng = np.random.default_rng(7)
    prompt = ids(rng, 100)
    shared = [R.Row(e, 0, prompt, ids(rng, 8), [0.0] * 8) for e in range(8)]
    apart = [R.Row(e, 0, ids(rng, 100), ids(rng, 8), [0.0] * 8) for e in range(8)]
    for rows, want in ((shared, "tree"), (apart, "rows")):
        tree = R.row_tree(rows, (128, 256, 1024), CFG)
        rw, tw = PT.rows_work(R.rows_shapes(rows, (128, 256, 1024))), PT.tree_work(tree)
        assert PT.choose_layout("auto", rw, tw, CFG)[0] == want
        assert PT.choose_layout("rows", rw, tw, CFG)[0] == "rows" and PT.choose_layout("tree", rw, tw, CFG)[0] == "tree"
    assert PT.distinct_tokens([r.prompt + r.completion for r in shared]) == 100 + 8 * 8
    assert PT.tree_work(R.row_tree(shared, (256,), CFG)).tokens == 256 < PT.rows_work([(8, 128)]).tokens
    with pytest.raises(ValueError, match="train_layout: 'trie' is not one of"):
        PT.choose_layout("trie", rw, tw, CFG)


def test_at_the_1b_shapes_the_react_tree_computes_under_twice_the_distinct_tokens():
    """The goal (update <= 2x the distinct tokens) at the H200 step's shapes (Llama-3.2-1B, 16 questions x G = 8
    RAG-Gym ReAct episodes, 3 turns): the per-row layout is 384 rows of 768 slots, 48 per trained token; the tree the cost model picks packs
    the same rows in 2048-token packs that compute each shared prefix about once per pack, under 2x the step's
    distinct tokens (at the tiny preset's cost, where attention weighs more, it picks 768-token packs: 2.25x)."""
    from benchmarks.train_layout import plan_1b

    plan = plan_1b(16)
    assert plan["rows_shape"] == "384x768" and plan["rows_per_trained"] == 48
    assert plan["tree_shape"].endswith("x2048") and plan["tree_per_distinct"] <= 2.0
    assert plan["tree_per_trained"] < plan["rows_per_trained"] / 4 and plan["flops_ratio"] < 0.25


def test_file_grpo_groups_tree_equals_rows():
    """File-based GRPO groups (one prompt, G scored completions; pipelines.train): the tree batch, whose advantages
    and aggregation weights are computed on the host, gives the per-row batch's loss, metrics and gradient (there
    the advantages are computed on device from the rewards), with the sampler's old log-probs for every aggregation,
    and on-policy; auto keeps rows for groups too small to share, forced modes are obeyed."""
    from jaxrag.train.batching import Group
    from jaxrag.train.objectives import make_prepare

    rng = np.random.default_rng(11)
    groups = []
    for _ in range(2):
        comps = [ids(rng, int(rng.integers(2, 6))) for _ in range(3)]
        groups.append(Group(ids(rng, 20), comps, list(rng.normal(size=3)),
                            [list(rng.normal(-3.0, 0.5, len(c))) for c in comps]))
    args = model_args()
    for aggregation in GRPO_AGGREGATIONS:
        tc = tconfig.resolve({"loss": "grpo", "batch_size": 6, "sampling_temperature": 0.9,
                              "grpo": {"group_size": 3, "beta": 0.04, "clip_eps": 0.2, "aggregation": aggregation}})
        fn, prepare = jax.jit(make_grad_fn(CFG, tc)), make_prepare(tc)
        on_policy = [Group(g.prompt, g.completions, g.rewards) for g in groups]   # (a compile each: one aggregation)
        for gs in (groups, on_policy) if aggregation == "token_mean" else (groups,):   # old log-probs, on-policy
            rows_b = R.group_batch_auto(gs, (32,), CFG, "rows", aggregation=aggregation)
            tree_b = R.group_batch_auto(gs, (32, 64), CFG, "tree", group_size=3, aggregation=aggregation)
            assert "read_pos" in tree_b and "read_pos" not in rows_b and ("old_logp" in tree_b) == (gs is groups)
            g_r, m_r = fn(*args, prepare(rows_b)[0], jax.random.PRNGKey(0))
            g_t, m_t = fn(*args, prepare(tree_b)[0], jax.random.PRNGKey(0))
            for k in ("loss", "clip_fraction", "kl/k2"):
                np.testing.assert_allclose(float(m_t[k]), float(m_r[k]), rtol=1e-5, atol=1e-7)
            assert_same(g_t, g_r)
    apart = [Group(ids(rng, 4), [ids(rng, 20) for _ in range(3)], [0.0, 1.0, 2.0]) for _ in range(2)]
    assert "read_pos" not in R.group_batch_auto(apart, (32,), CFG)
    assert "read_pos" in R.group_batch_auto(apart, (32,), CFG, "tree")


def test_the_file_grpo_stage_trains_on_the_tree_when_told(tmp_path, monkeypatch):
    """configs/train_grpo.py's stage with train_layout "tree" trains on tree batches, with the same per-step gradient
    norms and KL as its per-row run (float tolerance; its losses are near 0 on-policy); "auto" keeps per-row
    batches."""
    import json

    from configs import train_grpo
    from jaxrag.main import run
    from jaxrag.pipelines import train as train_pipeline

    made = []

    def spy(*a, **k):
        made.append("read_pos" in (b := R.group_batch_auto(*a, **k)))
        return b

    monkeypatch.setattr(train_pipeline, "group_batch_auto", spy)
    losses = {}
    for layout in ("auto", "tree"):
        c = train_grpo.get_config()
        c.grpo.train.steps, c.grpo.train.progress, c.grpo.train_layout = 3, False, layout
        run(c, str(tmp_path / layout))
        rows = [json.loads(x) for x in (tmp_path / layout / "grpo" / "metrics.jsonl").read_text().splitlines()]
        losses[layout] = [[r["grad_norm"], r["kl/k2"]] for r in rows]
    assert made and all(made)   # every tree-run batch, none in the auto run (it builds group_batch directly)
    np.testing.assert_allclose(losses["tree"], losses["auto"], rtol=1e-4, atol=1e-9)   # step 1: KL ~ 1e-14
