"""SFT then DPO (LoRA r=8 on q,k,v; reference = base with adapters off) on the toy task, tiny random Llama."""

import ml_collections

from configs.common.train import tiny_model, toy_data, train_stage


def get_config():
    c = ml_collections.ConfigDict()
    c.stages = ["data", "sft", "dpo"]
    c.model = tiny_model()
    c.data = toy_data()
    c.sft = train_stage("jaxrag.pipelines.train:train_stage", "data/sft.jsonl", loss="sft", steps=20, batch_size=8,
                        seq_buckets=(32,))
    c.sft.train.optimizer.lr = 1e-3
    c.dpo = train_stage("jaxrag.pipelines.train:train_stage", "data/pairs.jsonl", init="stage:sft", loss="dpo", steps=10,
                        batch_size=4, seq_buckets=(32,))
    c.dpo.train.dpo.beta = 0.1  # RAG-Gym code; ReasonRAG uses 0.3
    c.dpo.train.lora.enabled = True
    c.dpo.train.lora.rank = 8
    c.dpo.train.lora.alpha = 16.0
    c.dpo.train.optimizer.lr = 1e-3
    return c
