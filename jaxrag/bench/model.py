"""Model speed: JAX forward, training step and batched decode against transformers/PyTorch, same config, same run.

    python -m jaxrag.bench.model [--quick]

Also reports each step's achieved FLOP/s as a fraction of this machine's fp32 matmul peak (a large jnp.dot
timed in the same run), so the ceiling is the roofline, not PyTorch.
"""

from __future__ import annotations

import argparse
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrag.bench.common import table, time_it, write_result
from jaxrag.generate import SamplingParams, sample
from jaxrag.losses import token_logprobs
from jaxrag.models import ModelConfig, forward, init_params

CONFIG = ModelConfig(vocab_size=32000, d_model=512, n_layers=8, n_heads=8, n_kv_heads=2, head_dim=64, d_ff=1536, max_seq_len=1024)
QUICK = CONFIG.replace(n_layers=2, vocab_size=8000)


def forward_flops(cfg: ModelConfig, batch: int, seq: int) -> float:
    """Matmul FLOPs of one forward pass (projections, attention scores/values, LM head)."""
    D, L = cfg.d_model, cfg.n_layers
    proj = 2 * D * cfg.head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) + 2 * 3 * D * cfg.d_ff
    attn = 2 * 2 * seq * cfg.n_heads * cfg.head_dim  # per token: QK^T and PV over the full row
    head = 2 * D * cfg.vocab_size
    return batch * seq * (L * (proj + attn) + head)


def matmul_peak(n: int = 2048) -> float:
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    return 2 * n**3 / time_it(lambda: f(a).block_until_ready(), repeats=5)


def read_bandwidth(n_bytes: int = 1 << 29) -> float:
    """Bytes/s of a jitted sum over a large array: the memory roofline that bounds small-batch decode."""
    x = jnp.ones((n_bytes // 4,), jnp.float32)
    f = jax.jit(jnp.sum)
    f(x).block_until_ready()
    return n_bytes / time_it(lambda: f(x).block_until_ready(), repeats=5)


def jax_steps(cfg, batch, seq):
    params = init_params(cfg, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (batch, seq), 0, cfg.vocab_size)
    fwd = jax.jit(lambda p, t: forward(cfg, p, t))
    opt = optax.adamw(1e-4)
    opt_state = opt.init(params)

    def loss_fn(p, t):  # next-token cross-entropy through the trainer's own log-prob function
        return -jnp.mean(token_logprobs(forward(cfg, p, t), t)[:, 1:])

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(p, s, t):
        loss, g = jax.value_and_grad(loss_fn)(p, t)
        upd, s = opt.update(g, s, p)
        return optax.apply_updates(p, upd), s, loss

    state = {"p": jax.tree.map(jnp.copy, params), "s": opt_state}  # the step donates its inputs

    def step():
        state["p"], state["s"], loss = train_step(state["p"], state["s"], tokens)
        loss.block_until_ready()

    return params, (lambda: fwd(params, tokens).block_until_ready()), step


def torch_steps(cfg, batch, seq):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hf = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff, num_hidden_layers=cfg.n_layers,
                     num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                     max_position_embeddings=cfg.max_seq_len, pad_token_id=0, eos_token_id=None, bos_token_id=None)
    model = LlamaForCausalLM(hf)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def fwd():
        with torch.no_grad():
            model.eval()(tokens)

    def step():
        model.train()
        out = model(tokens, labels=tokens)
        out.loss.backward()
        opt.step()
        opt.zero_grad()

    def generate(prompt_len, new):
        prompts = tokens[:, :prompt_len]
        with torch.no_grad():
            model.eval().generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

    return fwd, step, generate


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="2 layers, 8k vocab, short runs (a smoke run)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else CONFIG
    B, T = args.batch, args.seq
    reps = 1 if args.quick else 3
    import torch

    torch.set_num_threads(os.cpu_count())
    peak = matmul_peak()
    bandwidth = read_bandwidth()
    params, j_fwd, j_step = jax_steps(cfg, B, T)
    t_fwd, t_fwd_pt = time_it(j_fwd, reps), None
    t_step = time_it(j_step, reps)
    p_fwd, p_step, p_gen = torch_steps(cfg, B, T)
    t_fwd_pt = time_it(p_fwd, reps)
    t_step_pt = time_it(p_step, reps)

    prompts = np.asarray(jax.random.randint(jax.random.PRNGKey(2), (B, args.prompt), 0, cfg.vocab_size)).tolist()
    gen_cfg = cfg.replace(eos_ids=())
    sp = SamplingParams(max_new_tokens=args.new)
    t_dec = time_it(lambda: sample(gen_cfg, params, prompts, sp, jax.random.PRNGKey(0)), reps)
    t_dec_pt = time_it(lambda: p_gen(args.prompt, args.new), reps)

    f_fwd = forward_flops(cfg, B, T)
    f_step = 3 * forward_flops(cfg, B, T)
    dec_tokens = B * args.new
    weight_bytes = 4 * (cfg.num_params() - cfg.vocab_size * cfg.d_model)  # fp32; the embedding is only gathered
    rows = [
        {"step": "forward", "jax tok/s": B * T / t_fwd, "torch tok/s": B * T / t_fwd_pt, "jax/torch": t_fwd_pt / t_fwd,
         "jax % peak": 100 * f_fwd / t_fwd / peak, "torch % peak": 100 * f_fwd / t_fwd_pt / peak},
        {"step": "train step (fwd+bwd+AdamW)", "jax tok/s": B * T / t_step, "torch tok/s": B * T / t_step_pt,
         "jax/torch": t_step_pt / t_step, "jax % peak": 100 * f_step / t_step / peak, "torch % peak": 100 * f_step / t_step_pt / peak},
        {"step": f"batched decode (B={B}, {args.prompt}+{args.new})", "jax tok/s": dec_tokens / t_dec, "torch tok/s": dec_tokens / t_dec_pt,
         "jax/torch": t_dec_pt / t_dec,
         # every decode step reads all weights once: bytes/s achieved against the measured read bandwidth
         "jax % bw": 100 * weight_bytes * args.new / t_dec / bandwidth, "torch % bw": 100 * weight_bytes * args.new / t_dec_pt / bandwidth},
    ]
    cols = ["step", "jax tok/s", "torch tok/s", "jax/torch", "jax % peak", "torch % peak", "jax % bw", "torch % bw"]
    print(f"model: {cfg.n_layers} layers, d_model {cfg.d_model}, heads {cfg.n_heads}/{cfg.n_kv_heads}, vocab {cfg.vocab_size}, "
          f"batch {B}, seq {T}; fp32; matmul peak {peak / 1e9:.1f} GFLOP/s; read bandwidth {bandwidth / 1e9:.1f} GB/s; "
          f"{cfg.num_params() / 1e6:.1f}M params")
    print(table(rows, cols))
    path = write_result("model", {"config": cfg.__dict__ | {"rope_scaling": None}, "batch": B, "seq": T,
                                  "matmul_peak_flops": peak, "read_bandwidth_bytes_per_s": bandwidth, "rows": rows, "quick": args.quick})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
