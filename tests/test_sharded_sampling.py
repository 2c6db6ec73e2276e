"""Rollouts split over every device: generate.sample on 8 fake CPU devices, rows over data x fsdp.

Sharded sampling gives the same tokens as one device (log-probs to float rounding), at T = 0 and T > 0 (a row's key
is fold_in(key, row), whatever device holds it); each device's KV cache holds B/n rows; the compiled decode step
gathers no KV cache; the decode memory check refuses what cannot fit, in one line, before compiling.
The 8-device part runs in a subprocess: XLA_FLAGS must be set before jax initialises.
"""

import textwrap

import numpy as np
import pytest
from fakes import run_on_fake_devices


SCRIPT = textwrap.dedent('''
    import json, re, sys
    import jax, jax.numpy as jnp, numpy as np
    from jaxrag import sharding as shd
    from jaxrag.sampling import generate as G
    from jaxrag.compilation import compilation
    from jaxrag.models import ModelConfig, init_params
    assert len(jax.devices()) == 8, jax.devices()
    cfg = ModelConfig(model_type="llama", vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                      head_dim=16, d_ff=128, max_seq_len=64)
    params = init_params(cfg, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(1, 128, rng.integers(2, 12))] for _ in range(5)]
    out = {}

    def run(name, p, layout, sp, **kw):
        c = G.sample(cfg, p, prompts[:kw.pop("n_prompts", 5)], sp, jax.random.PRNGKey(7), layout=layout, **kw)
        out[name] = {"tokens": c.tokens.tolist(), "logprobs": c.logprobs.tolist(), "lengths": c.lengths.tolist()}

    greedy = G.SamplingParams(temperature=0.0, max_new_tokens=8)
    hot = G.SamplingParams(temperature=1.0, top_k=20, max_new_tokens=8)
    cases = [("greedy", greedy, {}), ("hot_cascade", hot, {"n": 2, "n_prompts": 3}),
             ("hot_fork", hot, {"n": 3, "n_prompts": 2, "cascade": False})]
    for name, sp, kw in cases:
        run(f"{name}/one", params, None, sp, **dict(kw))
    rows = shd.make_mesh((1, 8, 1))
    p8, lay8 = G.place_for_decode(cfg, params, rows)
    out["layout_rows"] = lay8.weights
    for name, sp, kw in cases:
        run(f"{name}/rows8", p8, lay8, sp, **dict(kw))
    # 2 x 2 rows, weights over tensor = 2: a budget the replicated weights exceed half of, the split ones do not
    tp_mesh = shd.make_mesh((2, 2, 2))
    whole = G.weights_bytes(params)
    ptp, laytp = G.place_for_decode(cfg, params, tp_mesh, budget_bytes=int(1.5 * whole))
    out["layout_tp"] = laytp.weights
    out["tp_weight_fraction"] = G.weights_bytes(ptp) / whole
    for name, sp, kw in cases[:2]:
        run(f"{name}/tp", ptp, laytp, sp, **dict(kw))

    # the decode's own cache: rows per device, read from the output arrays' addressable shards
    B_pad, S = 16, 16 + 8
    toks, pos, valid = G.left_pad(prompts + prompts[:3] * 3, B_pad, 16)
    cache = G._zeros_cache(cfg, B_pad, S, rows)
    logits, cache = G._prefill(cfg, p8, *G._put_rows(rows, (toks, pos, valid)), cache)
    comp, cache = G.decode(cfg, p8, cache, logits, G._put_rows(rows, valid.sum(1).astype(np.int32)), 14, greedy,
                           jax.random.PRNGKey(0), mesh=rows)
    out["cache_shard_rows"] = sorted({s.data.shape[0] for s in cache["k"][0].addressable_shards})
    out["cache_shards"] = len(cache["k"][0].addressable_shards)
    out["cache_devices"] = len({s.device for s in cache["k"][0].addressable_shards})

    # the compiled decode chunk's collectives (replicated weights; weights over tensor)
    def collectives(p, mesh):
        cache = G._zeros_cache(cfg, B_pad, S, mesh)
        state = {"logits": jnp.zeros((B_pad, cfg.vocab_size)), "tokens": jnp.zeros((B_pad, 8), jnp.int32),
                 "logprobs": jnp.zeros((B_pad, 8)), "lengths": jnp.zeros(B_pad, jnp.int32),
                 "position": jnp.zeros(B_pad, jnp.int32), "done": jnp.zeros(B_pad, bool),
                 "stopped": jnp.zeros(B_pad, bool), "t": jnp.zeros((), jnp.int32)}
        (cache, state, keys), stop = G.on_params_mesh(p, (cache, state, G.row_keys(jax.random.PRNGKey(0), B_pad)),
                                                      jnp.asarray([1], jnp.int32), mesh)
        text = G._decode_chunk.lower(cfg, greedy, 8, p, cache, state, stop, keys, mesh=mesh).compile().as_text()
        pat = r"= (\\w+)\\[([\\d,]*)\\][^ ]* (all-gather|all-to-all|collective-permute|reduce-scatter|all-reduce)\\("
        return [[op, [int(d) for d in dims.split(",") if d]] for _, dims, op in re.findall(pat, text)]
    out["collectives_rows8"] = collectives(p8, rows)
    out["collectives_tp"] = collectives(ptp, tp_mesh)
    out["cache_dims"] = [cfg.n_kv_heads, S, cfg.head_dim]

    # the continuous slot pool: 8 slots (one a device), 10 requests through them, T > 0
    from jaxrag.sampling import SlotPool
    from jaxrag.models import unstack_layers
    def drain(p):
        pool = SlotPool(cfg, p, 8, 40, hot, jax.random.PRNGKey(3), chunk=4)
        for i in range(10):
            pool.submit(i, prompts[i % 5] + [i + 1], (i, 0))
        got, shard_rows = {}, set()
        while pool.busy:
            got.update({f.rid: [f.tokens, f.logprobs] for f in pool.step()})
            shard_rows |= {s.data.shape[0] for s in pool.cache["k"][0].addressable_shards}
        return [got[i] for i in range(10)], sorted(shard_rows)
    out["pool/one"], _ = drain(params)
    out["pool/rows8"], out["pool_shard_rows"] = drain(unstack_layers(p8))

    # the session pool: two turns of 4 sessions x 2 candidates, the second continuing the first's branches
    from jaxrag.sampling.sessions import SessionPool, sample_sessions
    def sessions(p):
        pool, ps, turns = SessionPool(cfg, 8, 64), [list(q) for q in prompts[:4]], []
        for turn in range(2):
            c = sample_sessions(cfg, p, pool, list(range(4)), ps, hot, jax.random.PRNGKey(turn), n=2)
            turns.append([c.tokens.tolist(), c.logprobs.tolist()])
            ps = [ps[i] + c.row(2 * i)[0] + [5, 6] for i in range(4)]
        return turns, pool.stats["reused"]
    out["sessions/one"], _ = sessions(params)
    out["sessions/rows8"], out["sessions_reused"] = sessions(unstack_layers(p8))

    # the memory check: weights that fit nowhere; a cache over the budget, refused before compiling
    try:
        G.place_for_decode(cfg, params, tp_mesh, budget_bytes=whole // 4)
        out["weights_refused"] = None
    except shd.DecodeMemoryError as e:
        out["weights_refused"] = str(e)
    c0 = compilation()[0]
    try:
        G.sample(cfg, p8, prompts * 8, greedy, jax.random.PRNGKey(0),
                 layout=shd.DecodeLayout(rows, "replicated", whole + 1000))
        out["cache_refused"] = None
    except shd.DecodeMemoryError as e:
        out["cache_refused"] = str(e)
    out["compiles_while_refusing"] = compilation()[0] - c0
    print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_on_fake_devices(SCRIPT, 8, tmp_path_factory.mktemp("sharded_sampling"), timeout=900)


@pytest.mark.parametrize("case, mesh", [("greedy", "rows8"), ("hot_cascade", "rows8"), ("hot_fork", "rows8"),
                                        ("greedy", "tp"), ("hot_cascade", "tp")])
def test_sharded_sample_equals_one_device(runs, case, mesh):
    one, got = runs[f"{case}/one"], runs[f"{case}/{mesh}"]
    assert got["tokens"] == one["tokens"] and got["lengths"] == one["lengths"]
    assert np.asarray(one["lengths"]).min() > 0
    np.testing.assert_allclose(got["logprobs"], one["logprobs"], rtol=1e-5, atol=1e-5)


def test_slot_pool_split_over_devices_equals_one_device(runs):
    assert runs["pool_shard_rows"] == [1]   # 8 slots over 8 devices
    for (t1, l1), (t8, l8) in zip(runs["pool/one"], runs["pool/rows8"]):
        assert t8 == t1 and len(t1) > 0
        np.testing.assert_allclose(l8, l1, rtol=1e-5, atol=1e-5)


def test_session_pool_decode_split_over_devices_equals_one_device(runs):
    assert runs["sessions_reused"] == 4   # the second turn continued every session's branch
    for (t1, l1), (t8, l8) in zip(runs["sessions/one"], runs["sessions/rows8"]):
        assert t8 == t1
        np.testing.assert_allclose(l8, l1, rtol=1e-5, atol=1e-5)


def test_layouts_chosen(runs):
    assert runs["layout_rows"] == "replicated"   # no budget on CPU: whole weights on every device
    assert runs["layout_tp"] == "tensor"
    assert runs["tp_weight_fraction"] < 0.75     # the large weights hold half of themselves per device


def test_each_device_holds_its_rows(runs):
    assert runs["cache_shards"] == runs["cache_devices"] == 8
    assert runs["cache_shard_rows"] == [16 // 8]


def test_decode_step_gathers_no_cache(runs):
    # replicated weights: a row-split decode needs no collective but the loop's "all rows done" flag
    assert runs["collectives_rows8"] and all(op == "all-reduce" and shape == [] for op, shape in runs["collectives_rows8"])
    # weights over tensor: activations are reduced; still nothing of the cache's shape gathered or moved
    kv = runs["cache_dims"]
    for op, shape in runs["collectives_tp"]:
        assert not (op != "all-reduce" and shape[-3:] == kv), (op, shape)
        assert op != "all-gather" or len(shape) < 3, (op, shape)


def test_memory_check_refuses_in_one_line(runs):
    w, c = runs["weights_refused"], runs["cache_refused"]
    assert w and "\n" not in w and "replicated" in w and "tensor=2" in w
    assert c and "\n" not in c and "KV cache" in c and "budget" in c and "per device" in c
    assert runs["compiles_while_refusing"] == 0
