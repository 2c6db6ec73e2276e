"""The agentic-RAG environment: MDP records, agents (prompts + parsers) and the batched rollout engine."""
from jaxrag.env.mdp import (Action, Doc, Episode, State, Step, answer_reward, discounted_return,
                            read_episodes, write_episodes)

__all__ = ["Action", "Doc", "Episode", "State", "Step", "answer_reward", "discounted_return",
           "read_episodes", "write_episodes"]
