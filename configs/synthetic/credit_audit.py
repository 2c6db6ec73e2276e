"""The credit audit (docs/credit_audit.md): every step-credit signal scored against replayed causal credit, on the
demo's SFT policy and critic:

python -m jaxrag.main --config=configs/synthetic/credit_audit.py --workdir=runs/demo --stages=credit_audit

Same workdir as `make demo` (or a seeds study's seed folder): the demo's stages have the same settings here, so
their policy and critic are reused; on a fresh workdir the stages it needs run first (world ... critic). The tiny
preset (`credit_audit.py:tiny`) audits the tiny pipeline's policy in a minute or two (tests).
"""

import importlib.util
from pathlib import Path

import ml_collections


def _load(name: str):
    """A config module beside this file (wherever the run starts from)."""
    spec = importlib.util.spec_from_file_location(f"synthetic_{name}_config", Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pipeline = _load("pipeline")


def get_config(preset: str = "demo"):
    c = pipeline.get_config(preset)
    c.stages = list(c.stages) + ["credit_audit"]
    sup = c.supervision
    # States from the SFT policy's own dev episodes; at each, its N samples at the supervision stage's temperature
    # plus the teacher's and the oracle's action. Truth: M continuations of the same policy at that temperature.
    c.credit_audit = ml_collections.ConfigDict(dict(
        fn="jaxrag.pipelines.synthetic.credit_audit:credit_audit_stage", policy="sft", critic="critic", agent="react",
        split="dev", max_questions=200, states=150, n_candidates=sup.n_candidates, temperature=sup.temperature,
        teacher=True, oracle=True, m=16, replay_temperature=sup.temperature, max_steps=sup.max_steps,
        max_new_tokens=sup.max_new_tokens, batch_size=128, rollout_from="supervision", z=1.96, bootstrap=1000,
        signals=["oracle", "oracle_rank", "llm_rank", "rollout", "critic", "smartsearch", "mcts", "logprob",
                 "confidence", "random"],
        # llm_rank's judge: the supervision section's http_judge where it names an endpoint (an LLM), else the
        # checkpoint of llm_judge.policy ranking with RAG-Gym's prompt; "" = none (the synthetic policy's context,
        # 272 tokens, cannot hold that prompt, ~1,700 tokens: its replies never parse)
        llm_judge=dict(policy="", max_new_tokens=48),
        # the mcts signal searches as findings.py's mcts stage does (its search settings, temperature, tokens and
        # batch), from each state with its candidates as the root's children, to mcts_rollouts simulations per
        # distinct candidate: the rollout signal's M continuations per candidate, at comparable compute
        mcts=_mcts_stage(preset), mcts_rollouts=sup.rollout_m))
    if preset == "tiny":
        c.credit_audit.update(dict(max_questions=12, states=12, n_candidates=2, m=8, max_steps=4, max_new_tokens=16,
                                   batch_size=64, bootstrap=200))
    return c


def _mcts_stage(preset: str) -> dict:
    """findings.py's mcts stage's search (`mcts`: MCTSConfig fields, less its per-tree budget max_rollouts and
    max_iterations, which mcts_rollouts replaces) and sampling settings."""
    s = _load("findings").get_config(preset).mcts
    search = {k: v for k, v in s.mcts.to_dict().items() if k not in ("max_rollouts", "max_iterations")}
    return dict(search=search, temperature=s.temperature, max_new_tokens=s.max_new_tokens, batch_size=s.batch_size)
