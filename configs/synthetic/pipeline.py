"""The synthetic multi-hop demo: `make demo` (15 min on 2 cores) or `--config.scale=tiny` (CI, < 2 min).

python -m jaxrag.main --config=configs/synthetic/pipeline.py --workdir=runs/demo [--config.scale=tiny]

A later stage (process rewards, DPO, critic, GRPO) is one more name in `stages`, one more section with its `fn`, and
an eval system "name:agent:model_stage" naming the directory its model is saved in.
"""

import ml_collections

S = "jaxrag.data.synthetic.stages"


def get_config():
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.scale = "demo"  # "demo" | "tiny" (presets in jaxrag/data/synthetic/stages.py:TINY win over the values below)
    c.stages = ["world", "index", "teacher", "tokenizer", "sft", "sft_re2search", "eval", "report"]

    # Many entities, so the policy cannot memorize the world and has to learn to read and copy (held-out names).
    c.world = dict(
        fn=f"{S}:world_stage",
        n_countries=40,
        n_cities=300,
        n_persons=2000,
        n_films=1000,
        n_companies=400,
        heldout_frac=0.1,
        split_fractions=(0.8, 0.1, 0.1),
        comparisons_per_anchor=0.5,
    )
    c.index = dict(fn=f"{S}:index_stage", backend="bm25s", k=2)
    c.teacher = dict(
        fn=f"{S}:teacher_stage",
        p_vague=0.1,
        p_redundant=0.1,
        p_premature=0.05,
        max_retries=3,
        max_steps=10,
        splits=("train", "dev", "heldout"),
    )  # never the test split
    c.tokenizer = dict(fn=f"{S}:tokenizer_stage", vocab_size=1024)
    c.model = dict(
        d_model=128,
        n_layers=4,
        n_heads=4,
        n_kv_heads=4,
        head_dim=32,
        d_ff=384,
        rope_theta=10000.0,
        max_seq_len=320,
        tie_embeddings=False,
    )
    sft = dict(
        fn=f"{S}:sft_stage",
        agent="react",
        init_from="",
        only_correct=True,
        lr=2e-3,
        batch_size=16,
        pack=True,
        # A step budget (deterministic); the time budget is a safety cap for slower machines.
        time_budget_s=600.0,
        max_steps=1500,
        warmup_steps=50,
        max_len=256,
        eval_every_s=60.0,
        eval_max_sequences=256,
    )
    c.sft = dict(sft)
    c.sft_re2search = dict(
        sft,
        fn=f"{S}:sft_re2search_stage",
        agent="re2search",
        init_from="sft",
        lr=1e-3,
        warmup_steps=10,
        max_steps=200,
        time_budget_s=100.0,
        eval_every_s=30.0,
    )
    c.eval = dict(
        fn=f"{S}:eval_stage",
        splits=("test", "heldout"),
        max_questions=400,
        max_steps=8,
        max_new_tokens=40,
        batch_size=128,
        systems=(
            "no_retrieval:direct:sft",
            "rag:rag:sft",
            "sft_react:react:sft",
            "sft_re2search:re2search:sft_re2search",
        ),
    )
    c.report = dict(fn=f"{S}:report_stage")
    return ml_collections.ConfigDict(c)
