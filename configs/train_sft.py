"""SFT on the toy copy task with a tiny random Llama: python -m jaxrag.main --config=configs/train_sft.py --workdir=runs/sft"""

import ml_collections

from configs.common.train import tiny_model, toy_data, train_stage


def get_config():
    c = ml_collections.ConfigDict()
    c.stages = ["data", "sft"]
    c.model = tiny_model()
    c.data = toy_data()
    c.sft = train_stage("jaxrag.pipelines.train:train_stage", "data/sft.jsonl", loss="sft", steps=20, batch_size=8,
                        seq_buckets=(32,))
    c.sft.train.optimizer.lr = 1e-3
    c.sft.train.optimizer.warmup_steps = 2
    c.sft.train.checkpoint.every_steps = 10
    return c
