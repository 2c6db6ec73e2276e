"""Offline GRPO on scored groups of the toy task (ARENA settings: k2 KL, beta 0.04, clip 0.2), tiny random Llama."""

import ml_collections

from configs.common.train import tiny_model, toy_data, train_stage


def get_config():
    c = ml_collections.ConfigDict()
    c.stages = ["data", "grpo"]
    c.model = tiny_model()
    c.data = toy_data(group_size=4)
    c.grpo = train_stage("jaxrag.pipelines.train:train_stage", "data/groups.jsonl", loss="grpo", steps=10,
                         batch_size=8, seq_buckets=(32,))
    c.grpo.train.grpo.group_size = 4
    c.grpo.train.grpo.kl_estimator = "k2"
    c.grpo.train.grpo.beta = 0.04
    c.grpo.train.grpo.clip_eps = 0.2
    c.grpo.train.grpo.aggregation = "token_mean"
    c.grpo.train.optimizer.lr = 1e-4
    return c
