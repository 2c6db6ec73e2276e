"""Online RL in the loop: multi-turn GRPO and PPO over live retrieval.

    from jaxrag.rl import RLConfig, train_rl
    result = train_rl(policy, retriever, agent, questions, "em", RLConfig(steps=100), {"loss": "grpo"}, workdir)

config.py: RLConfig (sampling/update settings) and the trainer keys it fixes; rows.py: episodes -> token rows,
advantages, aggregation weights, trajectory GAE; loop.py: the host loop (rollout -> reward -> rows -> update ->
telemetry -> checkpoint). The stage is jaxrag.pipelines.rl:rl_stage.
"""

from jaxrag.rl.config import RLConfig, default_rl_config, rl_train_config
from jaxrag.rl.loop import RLResult, train_rl

__all__ = ["RLConfig", "RLResult", "default_rl_config", "rl_train_config", "train_rl"]
