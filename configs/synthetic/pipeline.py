"""The synthetic multi-hop demo: `make demo`, or the `tiny` preset (CI, < 2 min):

python -m jaxrag.main --config=configs/synthetic/pipeline.py --workdir=runs/demo
python -m jaxrag.main --config=configs/synthetic/pipeline.py:tiny --workdir=runs/tiny [--config.sft.train.steps=50]

The preset is applied here, before any --config.* override, so a user's value always wins. Every budget is a step
count: the same seed gives the same results on any machine.
"""

import ml_collections

from configs.common.variant import variant

P = "jaxrag.pipelines.synthetic"
PRESETS = ("demo", "tiny", "control", "control_premature")


def trainer(**kw) -> ml_collections.ConfigDict:
    from jaxrag.train.config import default_train_config

    t = default_train_config()
    t.progress = True
    t.checkpoint.every_steps = 250
    for k, v in kw.items():
        if isinstance(v, dict):
            for kk, vv in v.items():
                t[k][kk] = vv
        else:
            t[k] = v
    return t


def get_config(preset: str = "demo"):
    if preset not in PRESETS:
        raise ValueError(f"configs/synthetic/pipeline.py: unknown preset {preset!r} ({' | '.join(PRESETS)})")
    c = ml_collections.ConfigDict()
    # seed: the SFT init, every trainer's data order and every sampling stream (the seeds study varies it:
    # configs/synthetic/seeds.py); world_seed: the world, its questions and the teacher's episodes (kept fixed)
    c.seed = 0
    c.world_seed = 0
    # Train questions kept out of SFT (the first N of the seeded train order): the supervision, outcome, GRPO and
    # findings stages sample from them, so process rewards and RL see questions the policy did not memorize in SFT.
    # With 0 (every stage on SFT-trained questions) the SFT policy answered 60 % of its
    # supervision questions against 29 % of unseen ones, and a critic on those pairs ordered dev candidates no better
    # than chance (results/synthetic_dev_tuning.md, trial f).
    c.unseen_questions = 1500  # the demo samples 300 of them; findings.py's supervision_big 1,200
    # True: keep whole anchor entities out (all their questions), so SFT has not learned the pool's first-hop facts
    # from sibling questions (world.unseen_pool); not yet measured in the demo
    c.unseen_by_anchor = False
    c.stages = ["world", "index", "teacher", "tokenizer", "sft", "supervision", "dpo", "critic",
                "outcome", "grpo", "agreement", "bestofn", "eval", "report"]   # + grpo_f1_penalty, a variant below

    # Many entities, so the policy cannot memorize the world and has to learn to read and copy (held-out names).
    c.world = dict(fn=f"{P}.world:world_stage", n_countries=40, n_cities=300, n_persons=2000, n_films=1000,
                   n_companies=400, heldout_frac=0.1, split_fractions=(0.8, 0.1, 0.1), comparisons_per_anchor=0.5)
    c.index = dict(fn=f"{P}.world:index_stage", backend="bm25s", k=2)  # k: the one home of documents per search
    # p_vague_first: decision density, each hop's first query vague with this probability (the control preset);
    # p_premature_last: an answer before the last hop's search with this probability (control_premature)
    c.teacher = dict(fn=f"{P}.world:teacher_stage", p_vague=0.1, p_redundant=0.1, p_premature=0.05, max_retries=3,
                     max_steps=10, p_vague_first=0.0, p_premature_last=0.0,
                     splits=("train", "dev", "heldout"))  # never the test split
    c.tokenizer = dict(fn=f"{P}.world:tokenizer_stage", vocab_size=1024, agents=("react", "re2search"))
    # ModelConfig fields (vocab_size and special ids come from the tokenizer).
    c.model = dict(model_type="llama", d_model=128, n_layers=4, n_heads=4, n_kv_heads=4, head_dim=32, d_ff=384,
                   rope_theta=10000.0, max_seq_len=320, tie_embeddings=False)
    # 720 steps on a warmup-stable-decay schedule (lr held, the last 20 % decaying) matched 900 on the cosine on the
    # dev split (teacher-forced all-actions-right 0.363 vs 0.348, dev EM 0.310 vs 0.290) at 80 % of the compute;
    # 600 fell short (results/synthetic_dev_tuning.md, trial i)
    c.sft = dict(fn=f"{P}.sft:sft_stage", agent="react", init_from="", only_correct=True, pack=True, max_len=256,
                 eval_every=120, eval_max_sequences=256,
                 train=trainer(loss="sft", steps=720, batch_size=16, seq_buckets=(64, 128, 192, 256),
                               optimizer=dict(lr=2e-3, warmup_steps=50, min_lr_ratio=0.1, weight_decay=0.01,
                                              schedule="wsd", decay_fraction=0.2)))
    # Process supervision: N candidates per state from the SFT policy, scored by the world's oracle (RAG-Gym
    # collection: execute the best, keep correct trajectories); pairs (score > 0.75, < 0.5) at the same state.
    # T = 0.5, not RAG-Gym's T = 1 (8B policies): a 1M-parameter policy at T = 1 mostly misspells names, so its
    # pairs teach "spell the name right"; chosen on the dev split (results/synthetic_dev_tuning.md).
    # agreement_questions: the dev questions every annotator scores for the agreement table (50 gave only 10 pairs
    # of candidates the oracle orders: too few to read).
    rollout_common = dict(max_steps=8, batch_size=64, max_new_tokens=40)
    c.supervision = dict(fn=f"{P}.supervise:supervision_stage", policy="sft", agent="react", max_questions=300,
                         n_candidates=4, temperature=0.5, outcome_threshold=0.75, agreement_questions=200,
                         rollout_m=2, http_judge=dict(base_url="", model=""), **rollout_common)
    pref_train = dict(steps=150, batch_size=8, seq_buckets=(128, 192, 256, 320),
                      optimizer=dict(lr=1e-4, warmup_steps=20, min_lr_ratio=0.1))
    c.dpo = dict(fn=f"{P}.preference:preference_stage", pairs="supervision", init="sft", max_len=320,
                 train=trainer(loss="dpo", dpo=dict(beta=0.1), **{**pref_train, "optimizer": dict(
                     lr=3e-5, warmup_steps=20, min_lr_ratio=0.1)}))  # beta: RAG-Gym code; lr: dev split
    c.critic = dict(fn=f"{P}.preference:preference_stage", pairs="supervision", init="sft", max_len=320,
                    train=trainer(loss="bt", bt=dict(center_coef=0.01), **{**pref_train, "optimizer": dict(
                        lr=3e-4, warmup_steps=20, min_lr_ratio=0.1)}))  # c = 0.01: RAG-Gym code
    # Outcome supervision at equal sampled data: SFT on the policy's own correct trajectories (rejection sampling).
    # Same sampling temperature as the supervision stage: the two supervision kinds differ only in what they keep.
    c.outcome = dict(fn=f"{P}.outcome:outcome_stage", policy="sft", budget_from="supervision", agent="react",
                     max_questions=300, keep_f1=1.0, temperature=c.supervision.temperature, max_len=256,
                     **rollout_common,
                     train=trainer(loss="sft", steps=150, batch_size=16, seq_buckets=(64, 128, 192, 256),
                                   optimizer=dict(lr=1e-4, warmup_steps=20, min_lr_ratio=0.1)))
    c.grpo = grpo_section(c)
    c.agreement = dict(fn=f"{P}.analysis:agreement_stage", records="supervision", critic="critic", agent="react")
    # N = 1, 2, 4, 8: accuracy vs N on a linear axis. Candidates sampled per step grow from 9 (N = 1, 4) to 29; the
    # time less than that (a step's candidates share one prompt prefill): bestofn's and grpo_f1_penalty's seconds
    # below are estimates (scaled from bestofn at N = 1, 4 and from grpo), not yet measured
    c.bestofn = dict(fn=f"{P}.analysis:bestofn_stage", policy="sft", critic="critic", agent="react", ns=(1, 2, 4, 8),
                     split="test", max_questions=100, temperature=0.5, **rollout_common)  # T: dev split
    c.eval = dict(
        fn=f"{P}.evaluate:eval_stage", splits=("test", "heldout"), max_questions=200, max_steps=8, max_new_tokens=40,
        batch_size=128, only="",
        systems=[
            dict(name="no_retrieval", agent="direct", model="sft"),
            dict(name="rag", agent="rag", model="sft"),
            dict(name="sft_react", agent="react", model="sft"),
            dict(name="outcome_rs", agent="react", model="outcome"),
            dict(name="dpo", agent="react", model="dpo"),
            dict(name="sft_critic_bo4", agent="react", model="sft", critic="critic", n=4, temperature=0.5),
            dict(name="dpo_critic_bo4", agent="react", model="dpo", critic="critic", n=4, temperature=0.5),
            dict(name="grpo", agent="react", model="grpo"),
        ],
    )
    c.report = dict(fn=f"{P}.report:report_stage")
    # A reference run's wall seconds per stage (2 cores, alone on the machine): the run's stage headers scale them by
    # this machine's pace into a time estimate. Neutral: they change no output (settings.NEUTRAL).
    c.expected_seconds = dict(world=5, index=5, teacher=5, tokenizer=5, sft=330, supervision=45, dpo=72, critic=57,
                              outcome=130, grpo=115, grpo_f1_penalty=115, agreement=5, bestofn=95, eval=125, report=5)
    c = ml_collections.ConfigDict(c)
    if preset == "tiny":
        apply_tiny(c)
    if preset == "control":
        # The positive control: the teacher begins each hop with a vague query half the time and then retries, so
        # the SFT policy inherits a step-level flaw its outcomes barely show; set the dose with
        # --config.teacher.p_vague_first (docs/demo.md, "A positive control").
        c.teacher.p_vague_first = 0.5
    if preset == "control_premature":
        # A planted flaw that costs answers: the teacher answers with a guess, before searching the last hop of a
        # multi-hop chain, half the time; SFT keeps every trajectory (failed ones too), so its policy inherits it.
        c.teacher.p_premature_last = 0.5
        c.sft.only_correct = False
    # The strong outcome baseline (Search-R1++'s reward): the grpo stage with reward F1 - 0.05 x searches, floored at
    # 0, instead of EM; the same steps x questions x G, temperature, KL and lr. Search-R1++ trains with REINFORCE;
    # GRPO here keeps the comparison with `grpo` to the reward alone. A right 3-hop answer in 3 searches earns 0.85.
    variant(c, "grpo", "grpo_f1_penalty", label="F1 - search penalty (Search-R1++) vs EM reward, same RL budget",
            reward="f1_search_penalty(0.05)")
    for s in c.stages:  # every trainer's data order follows `seed`
        if "train" in c[s] and "seed" in c[s].train and c[s].train.get_ref("seed") is not c.get_ref("seed"):
            c[s].train.seed = c.get_ref("seed")
    return c


def grpo_section(c) -> ml_collections.ConfigDict:
    """Online GRPO from the SFT policy with the EM reward (jaxrag.pipelines.rl over the synthetic world)."""
    from jaxrag.pipelines.rl import stage_config

    g = stage_config()
    g.policy.path = "stage:sft"
    g.retriever.corpus = "world/corpus.jsonl"
    g.questions.path = "sft/pool_questions.jsonl"  # the unseen pool (config.unseen_questions), written by sft
    g.agent.name, g.agent.mode, g.agent.max_doc_chars = "react", "plain", 1000
    g.reward = "em"
    # T 0.7 and G 8 (4 questions a step, the same 32 episodes): more groups with mixed outcomes than T 1 x G 4, whose
    # samples were mostly wrong; lr 1e-4. Chosen on the dev split (results/synthetic_dev_tuning.md, trials g and h).
    g.rl.update(dict(steps=30, questions_per_step=4, group_size=8, temperature=0.7, max_new_tokens=40, max_steps=8))
    g.rl.k = c.index.get_ref("k")  # one home: --config.index.k reaches the RL stage too
    g.rl.seed = c.get_ref("seed")
    g.train.grpo.beta = 0.04  # ARENA's k2 settings
    g.train.grpo.kl_estimator = "k2"
    g.train.seq_buckets = (64, 128, 192, 256, 320)
    g.train.optimizer.lr = 1e-4
    g.train.checkpoint.every_steps = 20
    if "sampler" in c:  # the sampler's shape floors (the tiny preset's), for the policy this stage loads
        g.policy.update(c.sampler)
    return g


def apply_tiny(c) -> None:
    """The whole pipeline in well under 2 minutes on a slow 2-core machine (CI)."""
    c.world.update(dict(n_countries=4, n_cities=12, n_persons=60, n_films=30, n_companies=12))
    c.unseen_questions = 64  # of 401 train questions (findings' supervision_big: 4 x 16)
    c.model.update(dict(d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=16, d_ff=64))
    # Compiling, not computing, is most of tiny's time: pad every sampler batch to >= 64 rows and 256 prompt tokens,
    # so the sampling stages share a few compiled programs (world.stage_policy; the GRPO stage's policy section)
    c.sampler = dict(min_rows=64, min_prompt=256)
    c.grpo.policy.update(c.sampler)
    c.sft.eval_every = 50
    c.sft.train.optimizer.schedule = "cosine"  # tiny keeps the schedule it was wired with
    c.sft.eval_max_sequences = 32
    c.sft.train.optimizer.warmup_steps = 2
    c.sft.train.progress = False
    # enough for some right answers on questions it never trained on (the unseen pool), so MCTS finds pairs
    c.sft.train.steps = 300
    c.sft.train.optimizer.lr = 5e-3
    # the tiny policy keeps the T = 1 sampling and DPO lr it was wired with (enough pairs and correct episodes)
    c.supervision.temperature = c.outcome.temperature = 1.0
    c.dpo.train.optimizer.lr = 1e-4
    c.dpo.train.seq_buckets = c.critic.train.seq_buckets = (320,)  # one compiled step each
    for s in ("dpo", "critic", "outcome"):
        c[s].train.steps = 6
        c[s].train.batch_size = 4
        c[s].train.optimizer.warmup_steps = 1
        c[s].train.progress = False
    # keep every trajectory's states (not only correct ones): a weak tiny policy still yields pairs to train on
    c.supervision.update(dict(max_questions=16, agreement_questions=6, rollout_m=2, max_steps=4, max_new_tokens=16,
                              outcome_threshold=-1.0))
    # keep every sampled trajectory: a weak tiny policy may answer none right, and the wiring must still run
    c.outcome.update(dict(max_questions=16, max_steps=4, max_new_tokens=16, keep_f1=0.0))
    c.bestofn.update(dict(ns=(1, 2), max_questions=8, max_steps=4, max_new_tokens=16, temperature=1.0))
    c.grpo.rl.update(dict(steps=2, questions_per_step=4, group_size=2, temperature=1.0, max_steps=4,
                          max_new_tokens=16))
    c.grpo.train.optimizer.lr = 5e-5
    c.grpo.train.progress = False
    c.eval.update(dict(max_questions=24, max_steps=4, max_new_tokens=16))
    c.expected_seconds = {}  # no reference run of tiny: headers show the time so far only
