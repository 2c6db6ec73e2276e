"""The longer studies a user starts deliberately, on top of the main job (configs/synthetic/pipeline.py):

python -m jaxrag.main --config=configs/synthetic/findings.py --workdir=runs/demo

Same workdir as `make demo`: the demo's stages have the same settings here, so they are reused (run it first, or
this runs them too), and the studies' stages follow:
  sft_re2search     SFT of the SFT policy on the teacher's episodes in the Re²Search format (a second policy)
  mcts              ReasonRAG MCTS-SPRE pairs from the SFT policy, as many sampled actions as the ranking collection
  dpo_mcts          DPO on them (the same trainer settings as `dpo` on the ranking pairs): supervision sources at
                    equal compute
  grpo_k3           GRPO from the SFT policy with the k3 KL estimator (`grpo` uses ARENA's k2), same seed and budget
  bestofn_transfer  the critic (trained on the ReAct policy's pairs) guiding the Re²Search policy: another format
  ss_data, ss_sft, ss_dpo, ss_grpo
                    SmartSearch's curriculum from the SFT policy (credited, refined data -> SFT -> DPO -> GRPO)
  supervision_big, dpo_big, critic_big, agreement_big, bestofn_big
                    the demo's process supervision on 4x the unseen questions: DPO, the critic, its agreement
                    with the oracle and best-of-N (is the demo's critic short of data?)
  eval_findings     the new systems on the demo's eval splits and question subset
  findings          findings.md + grpo_curves.png
The tiny preset (`findings.py:tiny`) runs the same stages in a minute or two (tests).
"""

import importlib.util
from pathlib import Path

import ml_collections


def _load_pipeline():
    """configs/synthetic/pipeline.py beside this file (wherever the run starts from)."""
    spec = importlib.util.spec_from_file_location("synthetic_pipeline_config", Path(__file__).with_name("pipeline.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pipeline = _load_pipeline()

P = "jaxrag.pipelines.synthetic"
STUDIES = ["sft_re2search", "mcts", "dpo_mcts", "grpo_k3", "bestofn_transfer", "ss_data", "ss_sft", "ss_dpo", "ss_grpo",
           "supervision_big", "dpo_big", "critic_big", "agreement_big", "bestofn_big", "eval_findings", "findings"]


# the studies behind the paired comparisons the seeds study reports over seeds (configs/synthetic/seeds.py:findings):
# MCTS vs ranking pairs, k3 vs k2, SmartSearch's curriculum vs SFT
PAIRED = ["mcts", "dpo_mcts", "grpo_k3", "ss_data", "ss_sft", "ss_dpo", "ss_grpo", "eval_findings"]


def get_config(preset: str = "demo"):
    """preset: demo | tiny | paired (the demo's stages and PAIRED alone: eval_findings evaluates the systems those
    train; every stage's settings are the demo's, so a demo run's workdir is reused)."""
    paired = preset == "paired"
    c = pipeline.get_config("demo" if paired else preset)
    c.stages = list(c.stages) + (PAIRED if paired else STUDIES)
    c.sft_re2search = ml_collections.ConfigDict(c.sft.to_dict())
    c.sft_re2search.update(dict(agent="re2search", init_from="sft", eval_every=50))
    c.sft_re2search.train.steps = 200
    c.sft_re2search.train.optimizer.update(dict(lr=1e-3, warmup_steps=10, schedule="cosine"))
    # ReasonRAG's search (its released code: 2 children per expansion, UCT "code", α = 0.9 in the preference
    # script), sized to the synthetic world: fewer rollouts per tree and depth = the demo's max_steps.
    c.mcts = dict(fn=f"{P}.mcts:mcts_stage", policy="sft", agent="react", budget_from="supervision",
                  max_questions=c.supervision.max_questions, trees_per_round=16,
                  temperature=c.supervision.temperature,  # the ranking pairs' sampling: equal footing
                  max_new_tokens=c.supervision.max_new_tokens, batch_size=c.supervision.batch_size,
                  mcts=dict(uct="code", c=1.414, max_children=2, max_rollouts=16, max_iterations=16,
                            max_depth=c.supervision.max_steps, rollouts_per_node=1, alpha=0.9, min_margin=0.01,
                            value_scheme="paper"))   # SPRE rollouts, one Q: no judge in the synthetic world
    c.dpo_mcts = ml_collections.ConfigDict(c.dpo.to_dict())
    c.dpo_mcts.pairs = "mcts"
    c.grpo_k3 = pipeline.grpo_section(c)
    c.grpo_k3.train.grpo.kl_estimator = "k3"
    # the same budget as `grpo`, whatever the preset made it (k and seed stay references to index.k and seed)
    c.grpo_k3.rl.update({k: v for k, v in c.grpo.rl.to_dict().items() if k not in ("k", "seed")})
    c.grpo_k3.train.progress = c.grpo.train.progress
    c.bestofn_transfer = ml_collections.ConfigDict(c.bestofn.to_dict())
    c.bestofn_transfer.update(dict(policy="sft_re2search", agent="re2search"))
    # SmartSearch's curriculum from the SFT policy: trajectories credited (novelty + the oracle's usefulness) and
    # refined -> stage 1 SFT (correct, every query good) -> stage 2 DPO on trajectory pairs -> stage 3 GRPO with the
    # composite reward (the paper's γ, φ and λ; step labels from novelty inside the reward, as the code's default)
    c.ss_data = dict(fn=f"{P}.smartsearch:curriculum_data_stage", policy="sft", agent="react",
                     max_questions=c.supervision.max_questions, samples=4,
                     temperature=c.supervision.temperature,
                     max_steps=c.supervision.max_steps, batch_size=c.supervision.batch_size,
                     max_new_tokens=c.supervision.max_new_tokens,
                     smartsearch=dict(overlap_threshold=1, correct_f1=0.8, require_judged=True))
    c.ss_sft = dict(fn=f"{P}.smartsearch:episodes_sft_stage", data="ss_data", init="sft", agent="react",
                    max_len=c.outcome.max_len, train=ml_collections.ConfigDict(c.outcome.train.to_dict()))
    c.ss_dpo = ml_collections.ConfigDict(c.dpo.to_dict())
    c.ss_dpo.update(dict(pairs="ss_data", init="ss_sft"))
    c.ss_grpo = pipeline.grpo_section(c)
    c.ss_grpo.policy.path = "stage:ss_dpo"
    c.ss_grpo.reward = "smartsearch"
    c.ss_grpo.rl.update({k: v for k, v in c.grpo.rl.to_dict().items() if k not in ("k", "seed")})
    c.ss_grpo.train.progress = c.grpo.train.progress
    # Process supervision at 4x the questions (the demo's 300 unseen questions give a critic no better than chance on
    # dev; 1,200 gave one well above it: results/synthetic_dev_tuning.md, trial f): the same collection on 1,200
    # unseen questions -> DPO and a critic with the demo's trainer settings; agreement on the demo's dev states
    c.supervision_big = ml_collections.ConfigDict(c.supervision.to_dict())
    c.supervision_big.update(dict(max_questions=4 * c.supervision.max_questions, agreement_questions=0, rollout_m=0))
    c.dpo_big = ml_collections.ConfigDict(c.dpo.to_dict())
    c.dpo_big.pairs = "supervision_big"
    c.critic_big = ml_collections.ConfigDict(c.critic.to_dict())
    c.critic_big.pairs = "supervision_big"
    c.agreement_big = ml_collections.ConfigDict(c.agreement.to_dict())
    c.agreement_big.critic = "critic_big"
    c.bestofn_big = ml_collections.ConfigDict(c.bestofn.to_dict())
    c.bestofn_big.critic = "critic_big"
    c.eval_findings = ml_collections.ConfigDict(c.eval.to_dict())
    c.eval_findings.systems = [dict(name="sft_re2search", agent="re2search", model="sft_re2search"),
                               dict(name="dpo_mcts", agent="react", model="dpo_mcts"),
                               dict(name="grpo_k3", agent="react", model="grpo_k3"),
                               dict(name="ss_sft", agent="react", model="ss_sft"),
                               dict(name="ss_dpo", agent="react", model="ss_dpo"),
                               dict(name="ss_grpo", agent="react", model="ss_grpo"),
                               dict(name="dpo_big", agent="react", model="dpo_big"),
                               dict(name="sft_critic_big_bo4", agent="react", model="sft", critic="critic_big", n=4,
                                    temperature=c.bestofn.temperature)]
    c.findings = dict(fn=f"{P}.findings:findings_stage", eval="eval", eval_findings="eval_findings",
                      sources=[dict(system="sft_react", pairs_from=""), dict(system="dpo", pairs_from="supervision"),
                               dict(system="dpo_mcts", pairs_from="mcts"),
                               dict(system="dpo_big", pairs_from="supervision_big")],
                      grpo=[dict(system="grpo", stage="grpo"), dict(system="grpo_k3", stage="grpo_k3")],
                      bestofn=[dict(label="ReAct (the critic's own policy)", stage="bestofn"),
                               dict(label="Re²Search (transfer)", stage="bestofn_transfer"),
                               dict(label="ReAct, critic on 4x the questions", stage="bestofn_big")],
                      agreement=[dict(label=f"critic ({c.supervision.max_questions} questions' pairs)",
                                      stage="agreement"),
                                 dict(label=f"critic_big ({c.supervision_big.max_questions} questions' pairs)",
                                      stage="agreement_big")],
                      smartsearch=dict(data="ss_data", systems=["sft_react", "ss_sft", "ss_dpo", "ss_grpo"]))
    if paired:   # a section that is not a stage counts as a global setting of every stage (workdir.stage_settings)
        c.eval_findings.systems = [x for x in c.eval_findings.systems if x["model"] in PAIRED]
        for study in set(STUDIES) - set(PAIRED):
            del c[study]
    if preset != "tiny":  # the studies' reference wall seconds (2 cores), for the stage headers' estimates
        c.expected_seconds.update(dict(
            sft_re2search=173, mcts=66, dpo_mcts=85, supervision_big=59, dpo_big=99, critic_big=77, bestofn_big=28,
            grpo_k3=143, bestofn_transfer=29, ss_data=80, ss_sft=113, ss_dpo=148, ss_grpo=85, eval_findings=128))
    if preset == "tiny":
        c.sft_re2search.train.steps = 20
        c.sft_re2search.train.optimizer.warmup_steps = 2
        c.mcts.update(dict(trees_per_round=4, max_new_tokens=c.supervision.max_new_tokens))
        c.mcts.mcts.update(dict(max_rollouts=6, max_iterations=6, max_depth=c.supervision.max_steps))
        c.ss_data.update(dict(max_questions=12))
        c.ss_data.smartsearch.update(dict(correct_f1=0.0, require_judged=False))  # a weak tiny policy: keep some
    for s in c.stages:  # the studies' sections are copies: their trainers' data order follows `seed` too
        if "train" in c[s] and "seed" in c[s].train and c[s].train.get_ref("seed") is not c.get_ref("seed"):
            c[s].train.seed = c.get_ref("seed")
    return c
