"""Model speed on whatever backend JAX finds: forward, the trainer's own training step, batched generation and
one decode step, against transformers/PyTorch on the same device, in the same run.

    python -m benchmarks.model [--preset cpu|quick|1b|8b] [--remat] [--no-torch]

Presets: `cpu` (default; 8 layers, d 512, fp32: the CPU table of the README), `quick` (a smoke run), `1b`
(Llama-3.2-1B shapes, bf16 compute, fp32 master weights: 8 x 2,048 tokens, decode B 64, prompt 512 + 256 new) and
`8b` (Llama-3.1-8B shapes; decode only, B 32, prompt 1,024 + 256 new: its fp32 AdamW state does not fit one GPU).

What it reports:
- tokens/s of each step, and model FLOP/s as a share of the matmul peak measured in the run (a large jitted
  matmul in the compute dtype) and, on a known accelerator, of its dense datasheet peak (MFU). Model FLOPs: the
  matmuls of the forward pass with attention over the full T x T square (the convention of the figures in issue
  12), x3 for a training step; remat's recomputation is not counted.
- the training step is `jaxrag.train.learner.build`'s jitted `make_train_step` (loss sft, AdamW without clipping,
  params in param_dtype, compute in the preset's dtype); the PyTorch peer is LlamaForCausalLM with sdpa
  attention, autocast to the same dtype and (on GPU) fused AdamW.
- batched generation: `generate.sample` (greedy, bf16 weights and KV cache on an accelerator, layers unstacked
  as the RL policy holds them) vs `model.generate` with a static and a dynamic cache.
- one decode step at several cache sizes, each cache full: time, the HBM roofline (weights + the whole KV cache
  read once at the bandwidth measured in the run), its share, and XLA's cost-analysis bytes accessed / those
  needed bytes: as XLA counts them, and with the embedding lookup counted as the rows it reads ("gather as rows":
  XLA's cost analysis counts a gather as reading its whole table, `gather_overcount`). The bytes are those of the
  one-pass program (cache_block 0): XLA counts the body of the window path's block loop once.
- the same step where the backend's default reads the cache's filled window (`ModelConfig.cache_block`, CPU): the
  one-pass program's time beside it, and a row for the largest cache holding only as many tokens as the smallest
  (a slot pool sized for its longest request, holding short ones), whose roofline counts the filled slots.
Writes results/bench/model[_<preset>].json, naming the device.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import os

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import table, time_it, write_result
from benchmarks.trainer_step import trainer_step
from jaxrag.models import ModelConfig, forward, init_params
from jaxrag.models.transformer import cache_block, decode_step, init_cache, unstack_layers
from jaxrag.sampling import SamplingParams, sample
from jaxrag.train.batching import SFTExample, sft_batch

CONFIG = ModelConfig(vocab_size=32000, d_model=512, n_layers=8, n_heads=8, n_kv_heads=2, head_dim=64, d_ff=1536, max_seq_len=1024)
LLAMA_32_1B = ModelConfig(vocab_size=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, d_ff=8192,
                          tie_embeddings=True, rope_theta=500000.0, max_seq_len=8192)
LLAMA_31_8B = ModelConfig(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, d_ff=14336,
                          rope_theta=500000.0, max_seq_len=8192)
# dense (no sparsity) datasheet peaks: bf16 FLOP/s and HBM bytes/s, by jax's device_kind
DATASHEET = {"NVIDIA H100 80GB HBM3": (989e12, 3.35e12), "NVIDIA H200": (989e12, 4.8e12), "TPU v5 lite": (197e12, 819e9),
             "TPU v5p": (459e12, 2.76e12), "TPU v4": (275e12, 1.2e12)}


@dataclasses.dataclass(frozen=True)
class Preset:
    cfg: ModelConfig
    dtype: str  # compute dtype (training, forward, decode)
    batch: int = 8
    seq: int = 512
    train: bool = True
    decode: tuple[int, int, int] = (8, 64, 128)  # (batch, prompt, new tokens) of batched generation
    slots: tuple[int, ...] = (192, 1024)  # cache sizes of the single decode-step rows
    repeats: int = 3


PRESETS = {
    "cpu": Preset(CONFIG, "float32"),
    "quick": Preset(CONFIG.replace(n_layers=2, vocab_size=8000), "float32", seq=128, decode=(4, 16, 16), slots=(64,), repeats=1),
    "1b": Preset(LLAMA_32_1B, "bfloat16", seq=2048, decode=(64, 512, 256), slots=(768, 2048, 4096), repeats=5),
    "8b": Preset(LLAMA_31_8B, "bfloat16", train=False, decode=(32, 1024, 256), slots=(1280,), repeats=3),
}


def forward_flops(cfg: ModelConfig, batch: int, seq: int) -> float:
    """Matmul FLOPs of one forward pass (projections, attention scores/values over the full row, LM head)."""
    D, L = cfg.d_model, cfg.n_layers
    proj = 2 * D * cfg.head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) + 2 * 3 * D * cfg.d_ff
    attn = 2 * 2 * seq * cfg.n_heads * cfg.head_dim  # per token: QK^T and PV over the full row
    head = 2 * D * cfg.vocab_size
    return batch * seq * (L * (proj + attn) + head)


def decode_bytes(cfg: ModelConfig, batch: int, slots: int) -> float:
    """Bytes one decode step must read at least: every weight but the embedding table (a gather) once, plus the
    whole KV cache (k and v of every layer, `slots` positions), in the compute dtype."""
    itemsize = jnp.dtype(cfg.dtype).itemsize
    weights = cfg.num_params() - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model)  # tied: the head is it
    kv = 2 * cfg.n_layers * batch * slots * cfg.n_kv_heads * cfg.head_dim
    return itemsize * (weights + kv)


def device_name() -> str:
    d = jax.devices()[0]
    return f"{d.platform}:{d.device_kind}"


def matmul_peak(dtype: str) -> float:
    """FLOP/s of a large jitted matmul in `dtype` (8192^2 on an accelerator, 2048^2 on CPU)."""
    n = 2048 if jax.default_backend() == "cpu" else 8192
    a = jnp.ones((n, n), dtype)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    return 2 * n**3 / time_it(lambda: f(a).block_until_ready(), repeats=5)


def read_bandwidth(n_bytes: int | None = None) -> float:
    """Bytes/s of a jitted sum over a large array: the memory roofline that bounds small-batch decode."""
    n_bytes = n_bytes or (1 << 29 if jax.default_backend() == "cpu" else 1 << 32)
    x = jnp.ones((n_bytes // 4,), jnp.float32)
    f = jax.jit(jnp.sum)
    f(x).block_until_ready()
    return n_bytes / time_it(lambda: f(x).block_until_ready(), repeats=5)


# ------------------------------------------------------------------------------------------------ JAX side
def jax_forward(cfg, params, batch, seq):
    tokens = jax.random.randint(jax.random.PRNGKey(1), (batch, seq), 0, cfg.vocab_size)
    fwd = jax.jit(lambda p, t: forward(cfg, p, t))
    return lambda: fwd(params, tokens).block_until_ready()


def jax_train_step(cfg, params, batch, seq, remat):
    """The trainer's own step (loss sft over every token) on a one-device mesh; returns a blocking step()."""
    rng = np.random.default_rng(0)
    ids = [int(x) for x in rng.integers(1, cfg.vocab_size, batch * seq)]
    examples = [SFTExample(ids[i * seq:i * seq + 1], ids[i * seq + 1:(i + 1) * seq]) for i in range(batch)]
    return trainer_step(cfg, params, {"loss": "sft", "batch_size": batch, "steps": 1000, "seq_buckets": (seq,),
                                      "compute_dtype": cfg.dtype, "remat": remat, "optimizer": {"clip_norm": 0.0}},
                        sft_batch(examples, (seq,)))


def jax_generate(cfg, params, batch, prompt, new, repeats):
    prompts = np.asarray(jax.random.randint(jax.random.PRNGKey(2), (batch, prompt), 1, cfg.vocab_size)).tolist()
    sp = SamplingParams(max_new_tokens=new)
    return time_it(lambda: sample(cfg, params, prompts, sp, jax.random.PRNGKey(0)), repeats)


def bytes_accessed(compiled) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get("bytes accessed", float("nan"))) if cost else float("nan")


def gather_overcount(params, batch: int) -> float:
    """Bytes XLA's cost analysis counts for the decode step's embedding lookup beyond the `batch` rows it reads:
    it counts a gather as reading its whole operand (the [V,D] table: 65.5 MB at the cpu preset, 525 MB at 1b)."""
    embed = params["embed"]
    token = jnp.ones((batch,), jnp.int32)
    counted = bytes_accessed(jax.jit(lambda e, t: jnp.take(e, t, axis=0)).lower(embed, token).compile())
    return counted - batch * embed.shape[1] * embed.dtype.itemsize - token.nbytes


def time_decode_step(cfg, params, cache: dict, position, steps: int = 16):
    """(median seconds of one decode step on `cache` (donated, as the sampler's; every step writes the same slot),
    XLA's bytes accessed for it, the first step's logits)."""
    step = jax.jit(functools.partial(decode_step, cfg), donate_argnums=(3,))
    token, index = jnp.ones(position.shape, jnp.int32), int(cache["index"])
    compiled = step.lower(params, token, position, cache).compile()
    logits, cache = compiled(params, token, position, cache)
    box = {"cache": dict(cache, index=jnp.asarray(index, jnp.int32))}

    def one():
        out, box["cache"] = compiled(params, token, position, box["cache"])
        box["cache"]["index"] = jnp.asarray(index, jnp.int32)
        out.block_until_ready()

    return time_it(one, steps), bytes_accessed(compiled), logits


def jax_decode_step(cfg, params, batch, slots, filled=None, steps=16):
    """Seconds of one decode step over a `slots`-slot cache whose rows hold `filled` tokens at slots [0, filled)
    (default: all but the slot the step writes), median over steps, and XLA's bytes accessed for it."""
    filled = slots - 1 if filled is None else filled
    cache = init_cache(cfg, batch, slots)
    cache["valid"], cache["index"] = cache["valid"].at[:, :filled].set(True), jnp.asarray(filled, jnp.int32)
    return time_decode_step(cfg, params, cache, jnp.full((batch,), filled, jnp.int32), steps)[:2]


# -------------------------------------------------------------------------------------------- PyTorch side
def torch_times(pre: Preset, remat: bool) -> dict:
    """Seconds per call of the PyTorch peer: LlamaForCausalLM of the same shapes (sdpa attention) on this machine's
    GPU when there is one. Run before JAX touches the device: each framework's allocator keeps what it took, and
    torch gives its back (empty_cache) while JAX's pool does not."""
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print(f"[bench] PyTorch peer unavailable: {e}")
        return {}
    cfg = pre.cfg
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(os.cpu_count())
    hf = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff, num_hidden_layers=cfg.n_layers,
                     num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                     max_position_embeddings=cfg.max_seq_len, tie_word_embeddings=cfg.tie_embeddings, rope_theta=cfg.rope_theta,
                     pad_token_id=0, eos_token_id=None, bos_token_id=None, attn_implementation="sdpa")
    cdt = getattr(torch, pre.dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = {"version": f"torch {torch.__version__} on {device}"}

    def model_in(dtype):
        torch.manual_seed(0)
        with torch.device(device):
            return LlamaForCausalLM._from_config(hf, dtype=dtype)

    if pre.train:
        out["forward"], out["step"] = _torch_train(torch, model_in(torch.float32), cdt, device, sync, pre, remat)
    if pre.decode is not None:
        model = model_in(cdt).eval()
        for cache in ("static", "dynamic"):
            try:
                out[cache] = _torch_generate(torch, model, device, sync, pre, cache)
            except Exception as e:  # a peer's failure is reported, not fatal
                print(f"[bench] torch generate ({cache} cache) failed: {type(e).__name__}: {e}")
        del model
    gc.collect()  # the training step's autograd graph and optimizer hold the model in reference cycles
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def _torch_train(torch, model, cdt, device, sync, pre: Preset, remat: bool) -> tuple[float, float]:
    """(forward s, training step s): fp32 master weights, autocast to the compute dtype, AdamW (fused on GPU)."""
    tokens = torch.randint(1, pre.cfg.vocab_size, (pre.batch, pre.seq), device=device)
    autocast = torch.autocast(device_type=device, dtype=cdt, enabled=cdt != torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device == "cuda")
    if remat:
        model.gradient_checkpointing_enable()

    def fwd():
        with torch.no_grad(), autocast:
            model.eval()(tokens)
        sync()

    def step():
        model.train()
        with autocast:
            loss = model(tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()

    return time_it(fwd, pre.repeats), time_it(step, pre.repeats)


def _torch_generate(torch, model, device, sync, pre: Preset, cache: str) -> float:
    db, prompt, new = pre.decode
    prompts = torch.randint(1, pre.cfg.vocab_size, (db, prompt), device=device)
    kw = {"cache_implementation": "static"} if cache == "static" else {}

    def gen():
        with torch.no_grad():
            model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=0, **kw)
        sync()

    return time_it(gen, pre.repeats)


# ------------------------------------------------------------------------------------------------- driver
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    ap.add_argument("--quick", action="store_true", help="same as --preset quick")
    ap.add_argument("--remat", action="store_true", help="rematerialize layers in both training steps")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch peer")
    ap.add_argument("--rows", choices=("all", "train", "inference"), default="all",
                    help="train: forward and training step only; inference: generation and decode steps only")
    args = ap.parse_args(argv)
    name = "quick" if args.quick else args.preset
    pre = PRESETS[name]
    pre = dataclasses.replace(pre, train=pre.train and args.rows != "inference",
                              decode=None if args.rows == "train" else pre.decode, slots=() if args.rows == "train" else pre.slots)
    cfg = pre.cfg.replace(dtype=pre.dtype)
    # JAX may take 92% of a GPU's memory (default 75%): torch, measured first, has given its memory back
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
    B, T, reps = pre.batch, pre.seq, pre.repeats
    pt = {} if args.no_torch else torch_times(pre, args.remat)
    device = device_name()
    peak = matmul_peak(pre.dtype)
    bandwidth = read_bandwidth()
    sheet_flops, sheet_bw = DATASHEET.get(jax.devices()[0].device_kind, (None, None))
    print(f"[bench] {device}; preset {name}: {cfg.n_layers} layers, d_model {cfg.d_model}, heads {cfg.n_heads}/{cfg.n_kv_heads}, "
          f"vocab {cfg.vocab_size}, {cfg.num_params() / 1e9:.2f}B params, compute {pre.dtype}; matmul peak "
          f"{peak / 1e12:.1f} TFLOP/s, read bandwidth {bandwidth / 1e9:.0f} GB/s; peer: {pt.get('version', 'none')}", flush=True)
    rows = []

    def show(r):
        rows.append(r)
        print(table([r], list(r)), flush=True)

    def flops_row(step, flops, t_jax, t_torch):
        r = {"step": step, "jax tok/s": B * T / t_jax, "jax TFLOP/s": flops / t_jax / 1e12, "jax % peak": 100 * flops / t_jax / peak}
        if sheet_flops:
            r["jax % datasheet"] = 100 * flops / t_jax / sheet_flops
        if t_torch:
            r |= {"torch tok/s": B * T / t_torch, "jax/torch": t_torch / t_jax, "torch % peak": 100 * flops / t_torch / peak}
        show(r)

    if pre.train:
        params = init_params(cfg, jax.random.PRNGKey(0))  # fp32 master weights
        flops_row(f"forward ({B} x {T})", forward_flops(cfg, B, T), time_it(jax_forward(cfg, params, B, T), reps), pt.get("forward"))
        step = jax_train_step(cfg, params, B, T, args.remat)
        del params
        try:
            flops_row(f"train step ({B} x {T}, remat {args.remat})", 3 * forward_flops(cfg, B, T), time_it(step, reps), pt.get("step"))
        except jax.errors.JaxRuntimeError as e:  # out of device memory: recorded, and the inference rows still run
            show({"step": f"train step ({B} x {T}, remat {args.remat})", "error": str(e).splitlines()[0][:200]})
        del step

    if pre.decode is not None:
        # inference: weights (and so the KV cache) in the compute dtype, layers unstacked as the policy holds them
        icfg = cfg.replace(param_dtype=pre.dtype, eos_ids=())
        iparams = unstack_layers(init_params(icfg, jax.random.PRNGKey(0)))
        db, prompt, new = pre.decode
        overcount = gather_overcount(iparams, db)
        t_gen = jax_generate(icfg, iparams, db, prompt, new, reps)
        gen = {"step": f"generate (B {db}, {prompt} + {new}, greedy)", "jax tok/s": db * new / t_gen}
        for cache in ("static", "dynamic"):
            if cache in pt:
                gen |= {f"torch {cache} tok/s": db * new / pt[cache], f"jax/torch {cache}": pt[cache] / t_gen}
        show(gen)
        one_pass = icfg.replace(cache_block=0)
        partial = (max(pre.slots), min(pre.slots)) if len(pre.slots) > 1 else None
        for slots, filled in [(s, None) for s in pre.slots] + ([partial] if partial else []):
            need = decode_bytes(icfg, db, filled or slots)
            t_one, accessed = jax_decode_step(one_pass, iparams, db, slots, filled)
            r = {"step": f"decode step (B {db}, {slots} slots" + (f", {filled} filled)" if filled else ")")}
            if cache_block(icfg, slots):   # the default may read the filled window: the one-pass program beside it
                t = jax_decode_step(icfg, iparams, db, slots, filled)[0]
                r |= {"ms": 1e3 * t, "one-pass ms": 1e3 * t_one, "one-pass / default": t_one / t}
            else:
                t = t_one
                r["ms"] = 1e3 * t
            r |= {"roofline ms": 1e3 * need / bandwidth, "% roofline": 100 * need / bandwidth / t, "needed GB": need / 1e9}
            if not filled:   # XLA's bytes of the one-pass program against the whole cache
                r |= {"XLA accessed GB": accessed / 1e9, "accessed / needed": accessed / need,
                      "gather as rows": (accessed - overcount) / need}
            if sheet_bw:
                r["% datasheet bw"] = 100 * need / sheet_bw / t
            show(r)

    cols = ["step", "jax tok/s", "torch tok/s", "jax/torch", "jax TFLOP/s", "jax % peak", "jax % datasheet", "torch % peak",
            "torch static tok/s", "jax/torch static", "torch dynamic tok/s", "jax/torch dynamic", "ms", "one-pass ms",
            "one-pass / default", "roofline ms",
            "% roofline", "% datasheet bw", "accessed / needed", "gather as rows", "error"]
    print(f"\n{device}, preset {name}")
    print(table(rows, [c for c in cols if any(c in r for r in rows)]))
    stem = ("model" if name == "cpu" else f"model_{name}") + ("_remat" if args.remat else "") + \
        ("" if args.rows == "all" else f"_{args.rows}")
    path = write_result(stem, {
        "device": device, "preset": name, "config": cfg.__dict__ | {"rope_scaling": None}, "batch": B, "seq": T,
        "remat": args.remat, "rows_measured": args.rows, "matmul_peak_flops": peak, "read_bandwidth_bytes_per_s": bandwidth,
        "datasheet": {"flops": sheet_flops, "bytes_per_s": sheet_bw}, "rows": rows,
        "torch": pt.get("version")})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
