"""Train-step speed on CPU for a small Llama: jaxrag SFT / DPO / GRPO steps vs a PyTorch DPO step.

    python -m benchmarks.train [--steps=5] [--only steps|layouts]

`layouts` (benchmarks.train_layout): the update's tokens per trained token and its time, per-row vs prefix-tree
layout, for RAG-Gym ReAct rows, append-only (merged) rows and DPO pairs; written under "layouts".

Peer: a hand-written DPO step (policy + frozen reference forward, sigmoid loss, AdamW) on transformers'
LlamaForCausalLM of the same size, measured in the same run (TRL is not installed in this environment);
torch gets as many threads as JAX uses (all cores; `--torch-threads` to change). Run it on a quiet machine: with
another job on the cores, multi-threaded torch oversubscribes and slows down far more than XLA does.
Prints a table and writes results/bench/train.json.
"""

from __future__ import annotations

import argparse
import os

import jax
import numpy as np

from benchmarks.common import table, time_first_and_median, write_result
from benchmarks.trainer_step import trainer_step
from jaxrag.models import ModelConfig, init_params
from jaxrag.train.batching import Group, PreferencePair, SFTExample, batch_tokens, group_batch, pair_batch, sft_batch

CFG = ModelConfig(model_type="llama", vocab_size=2048, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2,
                  head_dim=64, d_ff=768, max_seq_len=512)
SEQ, PAIRS, PROMPT = 128, 4, 64


def batches(rng):
    comp = SEQ - PROMPT
    ids = lambda n: [int(x) for x in rng.integers(1, CFG.vocab_size, n)]
    sft = sft_batch([SFTExample(ids(PROMPT), ids(comp)) for _ in range(2 * PAIRS)], (SEQ,))
    pairs = pair_batch([PreferencePair(ids(PROMPT), ids(comp), ids(comp)) for _ in range(PAIRS)], (SEQ,))
    groups = group_batch([Group(ids(PROMPT), [ids(comp) for _ in range(4)], list(rng.random(4))) for _ in range(2)], (SEQ,))
    return {"sft": sft, "dpo": pairs, "grpo": groups}


def time_jax(loss: str, batch: dict, steps: int) -> dict:
    params = init_params(CFG, jax.random.PRNGKey(0))
    step = trainer_step(CFG, params, {"loss": loss, "batch_size": 2 * PAIRS if loss != "dpo" else PAIRS,
                                      "steps": 1000, "grpo": {"group_size": 4}}, batch)
    compile_s, step_s = time_first_and_median(step, steps)
    return {"impl": "jaxrag", "loss": loss, "step_s": step_s, "tokens_per_s": batch_tokens(batch) / step_s,
            "first_step_s": compile_s}


def time_torch_dpo(batch: dict, steps: int, torch_threads: int) -> dict | None:
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print(f"[bench] PyTorch peer unavailable: {e}")
        return None
    torch.manual_seed(0)
    torch.set_num_threads(torch_threads)
    hf = LlamaConfig(vocab_size=CFG.vocab_size, hidden_size=CFG.d_model, intermediate_size=CFG.d_ff,
                     num_hidden_layers=CFG.n_layers, num_attention_heads=CFG.n_heads,
                     num_key_value_heads=CFG.n_kv_heads, head_dim=CFG.head_dim, max_position_embeddings=CFG.max_seq_len)
    policy, ref = LlamaForCausalLM(hf), LlamaForCausalLM(hf)
    ref.load_state_dict(policy.state_dict())
    ref.eval()
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-5, weight_decay=0.0)
    tokens = torch.tensor(batch["tokens"].reshape(-1, SEQ), dtype=torch.long)
    mask = torch.tensor(batch["loss_mask"].reshape(-1, SEQ))
    attn = torch.tensor(batch["segment_ids"].reshape(-1, SEQ) > 0).long()

    def seq_logps(model):
        logits = model(input_ids=tokens, attention_mask=attn).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None])[..., 0]
        return (lp * mask[:, 1:]).sum(-1).view(-1, 2)

    def step():
        with torch.no_grad():
            r = seq_logps(ref)
        p = seq_logps(policy)
        h = (p[:, 0] - r[:, 0]) - (p[:, 1] - r[:, 1])
        loss = -torch.nn.functional.logsigmoid(0.1 * h).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()

    first, step_s = time_first_and_median(step, steps)
    return {"impl": f"torch {torch.__version__} (hand-written DPO, {torch_threads} threads)", "loss": "dpo", "step_s": step_s,
            "tokens_per_s": batch_tokens(batch) / step_s, "first_step_s": first}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--torch-threads", type=int, default=os.cpu_count())
    ap.add_argument("--only", choices=("steps", "layouts"), default=None)
    a = ap.parse_args()
    if a.only == "layouts":
        from benchmarks import train_layout

        out = write_result("train_layout", train_layout.main(a.steps))
        print(f"wrote {out}")
        return
    b = batches(np.random.default_rng(0))
    rows = [time_jax(loss, b[loss], a.steps) for loss in ("sft", "dpo", "grpo")]
    peer = time_torch_dpo(b["dpo"], a.steps, a.torch_threads)
    if peer is not None:
        rows.append(peer)
        jax_dpo = next(r for r in rows if r["impl"] == "jaxrag" and r["loss"] == "dpo")
        for r in rows:
            if r["loss"] == "dpo":
                r["vs torch DPO (speedup)"] = peer["step_s"] / r["step_s"]
        print(f"jaxrag DPO step is {peer['step_s'] / jax_dpo['step_s']:.2f}x the speed of the PyTorch DPO step")
    shape = f"L={CFG.n_layers} D={CFG.d_model} V={CFG.vocab_size}; {PAIRS} pairs / 8 rows x {SEQ} tokens"
    print(f"CPU train steps, {shape}, {jax.device_count()} device(s)")
    print(table(rows, ["impl", "loss", "step_s", "tokens_per_s", "first_step_s", "vs torch DPO (speedup)"]))
    payload = {"model": CFG.__dict__ | {"rope_scaling": None}, "seq": SEQ, "pairs": PAIRS, "rows": rows}
    if a.only is None:
        from benchmarks import train_layout

        payload["layouts"] = train_layout.main(a.steps)
    write_result("train", payload)


if __name__ == "__main__":
    main()
