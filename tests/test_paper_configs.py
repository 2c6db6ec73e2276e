"""The papers' table configs (configs/<paper>/<table>.py): every smoke variant runs end to end through jaxrag.main
(tiny random checkpoint, shared benchmark files, BM25 on the fly) and writes a complete table with the index's gold
recall; the paper variants carry the published protocol; tuned rows are named "<agent>+<tuning>"."""

import importlib.util
import json
from pathlib import Path

import pytest

from jaxrag.main import StageError, plan, run

ROOT = Path(__file__).resolve().parents[1]
TABLES = {"rag_gym/table2": (6, {"eval": 3, "eval_medqa": 1}), "reasonrag/table2": (3, {"eval": 5}),
          "arena/table2": (1, {"eval": 3}), "smartsearch/table1": (5, {"eval": 4})}


def load(name: str, variant: str = ""):
    spec = importlib.util.spec_from_file_location(f"cfg_{name.replace('/', '_')}", ROOT / "configs" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(variant)


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
    """One smoke run per table config (shared by every test here)."""
    root = tmp_path_factory.mktemp("paper_smoke")
    out = {}
    for name in TABLES:
        wd = root / name.replace("/", "_")
        out[name] = (run(load(name, "smoke"), wd), wd)
    return out


@pytest.mark.parametrize("name", list(TABLES))
def test_smoke_variant_writes_every_row_and_the_recall_table(smoke_runs, name):
    n_agents, stages = TABLES[name]
    ran, wd = smoke_runs[name]
    assert ran == ["setup", *stages]
    cfg = json.loads((wd / "config.json").read_text())["config"]
    assert cfg["paper"] == name.split("/")[0] and cfg["table"] == name.split("/")[1] and cfg["model"] == "tiny-random"
    for stage, n_data in stages.items():
        rows = [json.loads(line) for line in (wd / stage / "metrics.jsonl").read_text().splitlines()]
        assert len(rows) == n_agents * n_data and all(r["n"] == 2 for r in rows)
        recall = json.loads((wd / stage / "index_recall.json").read_text())
        assert len(recall) == n_data and all(r["k"] == 2 and r["n"] == 2 for r in recall.values())
        table = (wd / stage / "table.md").read_text()
        assert "gold titles in index" in table and table.count("\n| ") >= n_agents + 1 + n_data
    if name == "rag_gym/table2":
        hp = json.loads((wd / "eval" / "index_recall.json").read_text())["HotpotQA"]
        assert hp["with_gold_titles"] == 2 and hp["gold_in_index"] == 1.0   # the shared corpus holds HotpotQA's gold
        assert "answer_recall" not in json.loads((wd / "eval_medqa" / "index_recall.json").read_text())["MedQA"]
    if name == "arena/table2":  # the generator reads each question's own paragraphs: its gold is among them
        rows = [json.loads(line) for line in (wd / "eval" / "metrics.jsonl").read_text().splitlines()]
        hp = next(r for r in rows if r["dataset"] == "HotpotQA")
        assert hp["gold_recall"] == 1.0 and hp["searches_mean"] == 0 and "arena_relevance" in hp


def test_paper_variants_carry_the_protocol():
    c = load("rag_gym/table2")
    assert [d["select"] for d in c.eval.datasets] == ["last:1000", "last:1000", "all"]
    assert (c.eval.rollout.k, c.eval.rollout.max_steps, c.eval.rollout.temperature) == (32, 10, 0.0)
    assert c.eval.retriever.kind == "hybrid" and c.eval_medqa.retriever.index_dir == "indexes/medcorp"
    assert c.eval_medqa.retriever.query_encoder.endswith("MedCPT-Query-Encoder")
    for r in (c.eval.retriever, c.eval_medqa.retriever):   # the released env's RRF: k 60 over lists 100 deep
        assert (r.rrf_k, r.depth) == (60, 100)
    assert c.eval.max_doc_chars is None and c.model == "Llama-3.1-8B-Instruct"
    c = load("reasonrag/table2")
    assert (c.eval.rollout.k, c.eval.rollout.max_steps, c.eval.retriever.kind) == (3, 4, "dense")
    assert [d["name"] for d in c.eval.datasets] == ["PopQA", "HotpotQA", "2Wiki", "Bamboogle", "MuSiQue"]
    c = load("arena/table2")
    assert (c.eval.rollout.max_steps, c.eval.judge.model) == (1, "gpt-4o-2024-11-20")
    c = load("smartsearch/table1")
    assert (c.eval.rollout.k, c.eval.rollout.max_steps, c.model) == (5, 6, "Qwen2.5-3B-Instruct")
    with pytest.raises(ValueError, match="unknown variant 'smok'"):
        load("arena/table2", "smok")


def test_arena_and_smartsearch_configs_generate_and_read_as_released():
    """ARENA samples with no stop string (to EOS or the token limit: the fork's and the inference's vLLM params),
    Table 2 at the released inference's T 0.9 and 1,024 tokens; SmartSearch's eval rows read the released
    evaluation's answer. The old stop at </answer> is one option away, and a bad option names its key."""
    from jaxrag.env.agents import get_agent
    from jaxrag.pipelines.common import load_agent

    g = load("arena/grpo")
    assert (g.rl.agent.opts.stop_at, g.rl.rl.max_new_tokens, g.rl.rl.temperature) == ("eos", 256, 0.9)
    assert load_agent(g.rl.agent, None).stop == ()
    g.rl.agent.opts.stop_at = "answer"
    assert load_agent(g.rl.agent, None).stop == ("</answer>",)
    f3 = load("arena/fig3")   # every ablation's RL stage and eval row: the released stop
    assert all(load_agent(f3[s].agent, None).stop == () for s in f3.stages if "agent" in f3[s])
    t2 = load("arena/table2")
    assert (t2.eval.rollout.temperature, t2.eval.rollout.max_new_tokens) == (0.9, 1024)
    assert [get_agent(a["name"], **a.get("opts", {})).stop for a in t2.eval.agents] == [()]
    assert all((f3[r].rollout.temperature, get_agent(f3[r].agents[0]["name"]).stop) == (0.9, ())
               for r in f3.stages if r.startswith("eval_"))
    t1, t3 = load("smartsearch/table1"), load("smartsearch/table3")
    rows = [a for a in t1.eval.agents if a["name"] == "smartsearch"]
    rows += [t3[r].agents[0] for r in t3.stages if r.startswith("eval_")]
    assert len(rows) == 10 and all(get_agent(a["name"], **a.get("opts", {})).eval_answer == "boxed" for a in rows)
    bad = load("arena/grpo", "smoke")
    bad.rl.agent.opts.stop_at = "eos_token"
    with pytest.raises(StageError, match=r"config.rl.agent: .*stop_at must be one of 'eos', 'answer'"):
        plan(bad, ["rl"])


def test_paper_variant_needs_a_checkpoint_before_any_compute():
    with pytest.raises(StageError, match=r"config.eval.policy.path: empty: set --config.eval.policy.path=<a Hugging"):
        plan(load("smartsearch/table1", "shared"))


def test_tuned_rows_are_named_by_their_tuning(smoke_runs, tmp_path):
    _, wd = smoke_runs["smartsearch/table1"]
    c = load("smartsearch/table1", "smoke")
    c.stages = ["eval"]
    c.eval.policy.path = str(wd / "setup" / "model")
    c.eval.datasets = c.eval.datasets[:1]
    c.eval.tuning = "dpo"
    assert run(c, tmp_path / "tuned") == ["eval"]
    rows = [json.loads(line) for line in (tmp_path / "tuned" / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert [r["method"] for r in rows] == ["direct+dpo", "cot+dpo", "rag+dpo", "search_o1+dpo", "smartsearch+dpo"]


# ---- RAG-Gym's tuned protocols: critic best-of-N (Table 3), SFT -------------------------------------------------
def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def rag_gym_table3(tmp_path_factory):
    wd = tmp_path_factory.mktemp("rg_t3")
    return run(load("rag_gym/table3", "smoke"), wd), wd


def test_rag_gym_table3_smoke_trains_a_critic_and_selects_with_it(rag_gym_table3):
    from jaxrag.pipelines.published import METHODS

    ran, wd = rag_gym_table3
    assert ran == ["setup", "setup_critic", "collect", "dpo", "critic_pairs", "critic", "eval_zs", "eval"]
    collected = json.loads((wd / "collect" / "stats.json").read_text())["pairs"]
    pairs = _rows(wd / "critic_pairs" / "pairs.jsonl")
    assert len(pairs) == collected > 0                       # every collected pair fits the critic's 1,024 tokens
    critic_cfg = json.loads((wd / "critic" / "model" / "config.json").read_text())
    assert all(max(p["prompt_ids"] + p["chosen_ids"] + p["rejected_ids"]) < critic_cfg["vocab_size"] for p in pairs)
    assert (wd / "critic" / "model" / "head.npz").is_file()
    assert json.loads((wd / "critic" / "summary.json").read_text())["step"] == 2
    rows = _rows(wd / "eval" / "metrics.jsonl")
    assert [(r["method"], r["dataset"]) for r in rows] == \
        [("re2search+dpo+critic", d) for d in ("HotpotQA", "2Wiki", "Bamboogle")]
    assert all(r["n"] == 2 and r["n_candidates"] == 2 and r["temperature"] == 1.0 and "cem" in r for r in rows)
    assert {r["method"] for r in _rows(wd / "eval_zs" / "metrics.jsonl")} == {"react", "search_o1"}
    assert {r["method"] for r in rows} | {"react", "search_o1"} == \
        {m for (p, t, _), m in METHODS.items() if (p, t) == ("rag_gym", "table3")}
    from jaxrag.env.mdp import read_episodes
    eps = read_episodes(wd / "eval" / "re2search+dpo+critic__HotpotQA.episodes.jsonl")
    assert all(len(s.candidates) == 1 for ep in eps for s in ep.steps)   # the N - 1 candidates the critic passed over


def test_rag_gym_fig4_rows_one_per_n_with_the_trained_critic(rag_gym_table3, tmp_path):
    """fig4.py's smoke eval over table3's smoke actor and critic (shared, to keep CI short): one row per N."""
    _, t3 = rag_gym_table3
    c = load("rag_gym/fig4", "smoke")
    c.stages = ["eval"]
    c.base_model = str(t3 / "setup" / "model")
    for a in c.eval.agents:
        a["critic"] = str(t3 / "critic" / "model")
    assert run(c, tmp_path / "fig4") == ["eval"]
    rows = _rows(tmp_path / "fig4" / "eval" / "metrics.jsonl")
    assert [(r["method"], r["n_candidates"]) for r in rows] == [("re2search+critic-n1", 1), ("re2search+critic-n2", 2)]
    assert load("rag_gym/fig4").eval.agents[-1] == {"name": "re2search", "critic": "stage:critic", "n": 10,
                                                    "temperature": 1.0, "variant": "n10"}


def test_rag_gym_sft_trains_by_epochs_on_collected_rows(rag_gym_table3, tmp_path):
    """sft.py's smoke sft + eval over table3's smoke collection: steps = ceil(1 epoch x rows / batch 2)."""
    _, t3 = rag_gym_table3
    c = load("rag_gym/sft", "smoke")
    c.stages = ["sft", "eval"]
    c.base_model = str(t3 / "setup" / "model")
    c.sft.data = str(t3 / "collect" / "sft.jsonl")
    assert run(c, tmp_path / "sft") == ["sft", "eval"]
    n_rows = len((t3 / "collect" / "sft.jsonl").read_text().splitlines())
    summary = json.loads((tmp_path / "sft" / "sft" / "summary.json").read_text())
    assert (summary["epochs"], summary["rows"]) == (1, n_rows) and summary["step"] == summary["steps"] == -(-n_rows // 2)
    assert [r["method"] for r in _rows(tmp_path / "sft" / "eval" / "metrics.jsonl")] == ["re2search+sft"]
    p = load("rag_gym/sft")
    assert (p.sft.epochs, p.sft.train.batch_size, p.sft.train.optimizer.lr, p.sft.train.lora.rank) == (3, 64, 5e-5, 256)


def test_rag_gym_table4_rows_per_reward_source(rag_gym_table3, tmp_path):
    """table4.py's smoke rollout values + eval over table3's smoke collection and critic (shared, to keep CI short):
    one best-of-N row per reward source, named as published.METHODS; the rollout values' agreement table."""
    from jaxrag.pipelines.published import METHODS

    _, t3 = rag_gym_table3
    c = load("rag_gym/table4", "smoke")
    c.stages = ["rollout", "eval"]
    c.base_model = str(t3 / "setup" / "model")
    c.rollout.records = str(t3 / "collect" / "records.jsonl")
    for a in c.eval.agents:
        if isinstance(a["critic"], str):
            a["critic"] = str(t3 / "critic" / "model")
    assert run(c, tmp_path / "t4") == ["rollout", "eval"]
    agree = json.loads((tmp_path / "t4" / "rollout" / "stats.json").read_text())["agreement"]
    assert [(r["source"], r["reference"]) for r in agree] == [("rollout", "rank:shortest")] and agree[0]["pairs"] > 0
    assert "no human annotations" in (tmp_path / "t4" / "rollout" / "agreement.md").read_text()
    rows = _rows(tmp_path / "t4" / "eval" / "metrics.jsonl")
    assert [r["method"] for r in rows] == ["re2search+critic", "re2search+critic-llama", "re2search+critic-random"]
    assert all(r["n_candidates"] == 2 for r in rows)
    full = load("rag_gym/table4")
    methods = {a.get("variant", "") for a in full.eval.agents}
    assert {f"re2search+critic-{v}" if v else "re2search+critic" for v in methods} == \
        {m for (p, t, _), m in METHODS.items() if (p, t) == ("rag_gym", "table4")} - {"re2search+orm"}
    assert full.stages[-1] == "eval" and {"critic", "critic_llama", "critic_rollout"} <= set(full.stages)


def test_rag_gym_ppo_rewards_actions_with_the_critic(rag_gym_table3, tmp_path):
    """ppo.py's smoke PPO (per-step rewards from table3's smoke critic) + eval: the tuned row "re2search+ppo"."""
    _, t3 = rag_gym_table3
    c = load("rag_gym/ppo", "smoke")
    c.stages = ["ppo", "eval"]
    c.base_model = str(t3 / "setup" / "model")
    c.ppo.prm = str(t3 / "critic" / "model")
    assert run(c, tmp_path / "ppo") == ["ppo", "eval"]
    assert (tmp_path / "ppo" / "ppo" / "model" / "head.npz").is_file()     # PPO's value head beside the policy
    assert [r["method"] for r in _rows(tmp_path / "ppo" / "eval" / "metrics.jsonl")] == ["re2search+ppo"]
    c.ppo.train.loss = "grpo"
    with pytest.raises(StageError, match=r"config.ppo.prm: per-step PRM rewards need a loss of PPO's layout"):
        plan(c)
    # the per-step rewards PPO gets: the critic's score of each executed action in its state, as best-of-N scores it
    from jaxrag.env.mdp import read_episodes
    from jaxrag.pipelines.eval import load_critic, load_prm

    eps = read_episodes(t3 / "eval" / "re2search+dpo+critic__HotpotQA.episodes.jsonl")
    rewards = load_prm(str(t3 / "critic" / "model"), "prm", t3, c.ppo.agent)(eps)
    assert [len(r) for r in rewards] == [len(ep.steps) for ep in eps] and len(set(sum(rewards, []))) > 1
    scorer = load_critic(str(t3 / "critic" / "model"), "critic", t3, "re2search", {"max_doc_chars": 60}).scorer
    expect = [float(scorer.score_states([ep.state(0)], [[ep.steps[0].action.raw]])[0][0]) for ep in eps]
    assert [r[0] for r in rewards] == pytest.approx(expect, abs=1e-5)


# ---- the training-row configs: ReasonRAG Table 3, SmartSearch Table 3 -------------------------------------------
def _eval_methods(c) -> set[str]:
    from jaxrag.pipelines.eval import method_name

    return {method_name(dict(a), c[s].tuning) for s in c.stages if c[s].fn.endswith(":eval_stage") for a in c[s].agents}


def _published(paper: str, table: str) -> set[str]:
    from jaxrag.pipelines.published import METHODS

    return {m for (p, t, _), m in METHODS.items() if (p, t) == (paper, table)}


@pytest.mark.parametrize("name", ["rag_gym/sft", "rag_gym/dpo", "rag_gym/ppo"])
def test_rag_gym_tuned_rows_take_any_of_the_six_designs(name):
    """Each of Table 2's tuned rows is one config argument: the design collects, trains and is evaluated."""
    tuning = name.split("/")[1]
    published = _published("rag_gym", "table2")
    for arg, variant, agent in (("", "", "re2search"), ("react", "", "react"), ("shared,cot", "shared", "cot"),
                                ("search_o1,smoke", "smoke", "search_o1")):
        c = load(name, arg)
        assert c.collect.agent.name == agent and _eval_methods(c) == {f"{agent}+{tuning}"} <= published
        if tuning == "ppo":
            assert c.ppo.agent.name == agent
        assert ("setup" in c.stages) == (variant == "smoke")
        if variant == "shared":
            assert c.eval.datasets[0]["select"] == "last:250"
    assert len(plan(load(name, "smoke,direct"))) == len(load(name, "smoke").stages)
    for bad in ("reactt", "react,cot", "shared,smoke"):
        with pytest.raises(ValueError, match=rf"{name}.py: unknown argument {bad!r} \(a variant of '', 'shared', "
                                             r"'smoke', an agent of direct, cot, rag, react, search_o1"):
            load(name, bad)


@pytest.mark.parametrize("name", ["rag_gym/sft", "rag_gym/dpo", "rag_gym/ppo"])
def test_rag_gym_tuned_rows_medqa_column(name):
    """`medqa` makes a tuned row its MedQA column: collect (and PPO) on RAG-Gym's 1,000 MedQA training questions over
    the medical corpus with MedCPT, trajectories kept by the chosen option, the eval on Table 2's MedQA stage."""
    c, t2 = load(name, "medqa,cot"), load("rag_gym/table2")
    assert (c.collect.questions.path, c.collect.questions.select) == ("data/medqa_train_1000.jsonl", "all")
    assert c.collect.retriever.to_dict() == t2.eval_medqa.retriever.to_dict()
    assert c.collect.ranking.outcome_metric == "acc" and c.collect.agent.name == "cot"
    assert c.eval.datasets == t2.eval_medqa.datasets and c.eval.retriever.to_dict() == t2.eval_medqa.retriever.to_dict()
    assert _eval_methods(c) == {f"cot+{name.split('/')[1]}"}
    if "ppo" in c:   # PPO's episodes search the same corpus, with both MedCPT encoders
        assert c.ppo.reward == "acc" and c.ppo.questions.path == c.collect.questions.path
        assert (c.ppo.retriever.query_encoder, c.ppo.retriever.depth) == ("models/MedCPT-Query-Encoder", 100)
    assert load(name, "cot").collect.questions.select == "first:1000"   # without it: HotpotQA, as before
    s = load(name, "smoke,medqa")
    assert s.collect.questions.path.endswith("medqa_usmle_4opt_test_1273.jsonl") and len(plan(s)) == len(s.stages)
    with pytest.raises(ValueError, match=r"'medqa' has no 'shared' variant"):
        load(name, "shared,medqa")


@pytest.mark.parametrize("name", ["rag_gym/table4", "rag_gym/fig4"])
def test_rag_gym_critic_configs_medqa_column(name):
    """Table 4's and Fig. 4's MedQA column: every collection (GPT-4o's, Llama's) and the rollout values on the MedQA
    training sample over the medical corpus, scored by the chosen option; the critics' best-of-N on MedQA test."""
    c, t2 = load(name, "medqa"), load("rag_gym/table2")
    collects = [n for n in c.stages if n.startswith("collect")]
    assert collects == (["collect", "collect_llama"] if name.endswith("table4") else ["collect"])
    for n in collects:
        assert c[n].questions.path == "data/medqa_train_1000.jsonl" and c[n].ranking.outcome_metric == "acc"
        assert c[n].retriever.to_dict() == t2.eval_medqa.retriever.to_dict()
    if "rollout" in c:
        assert c.rollout.rollouts.metric == "acc" and c.rollout.retriever.encoder == "models/MedCPT-Article-Encoder"
        assert load(name).rollout.rollouts.metric == "f1"
    assert [d["name"] for d in c.eval.datasets] == ["MedQA"] and _eval_methods(c) == _eval_methods(load(name))
    assert [d["name"] for d in load(name).eval.datasets] == ["HotpotQA", "2Wiki", "Bamboogle"]
    s = load(name, "smoke,medqa")
    assert {s[n].questions.select for n in s.stages if "questions" in s[n]} == {"first:4"}
    assert len(plan(s)) == len(s.stages)
    with pytest.raises(ValueError, match=r"unknown argument 'react' \(a variant of '', 'shared', 'smoke' and/or the "):
        load(name, "react")


def test_training_row_configs_pass_the_static_checks_and_name_the_published_rows():
    rr = load("reasonrag/table3", "smoke")
    assert [n for n, _ in plan(rr)] == ["setup", "mcts", "dpo", "sft", "orl_5k", "orl_10k", "eval_base", "eval_dpo",
                                        "eval_sft", "eval_orl_5k", "eval_orl_10k"]
    assert _eval_methods(rr) == _published("reasonrag", "table3")
    ss = load("smartsearch/table3", "smoke")
    assert len(plan(ss)) == 1 + 12 + 9
    assert _eval_methods(ss) == _published("smartsearch", "table3")  # every row, the refinement rollout's included
    for name in ("reasonrag/table3", "smartsearch/table3"):
        for variant in ("", "shared"):
            c = load(name, variant)
            c.base_model = "/models/base"
            if "judge" in c:
                with pytest.raises(StageError, match=r"config.s1_data.judge: an http judge needs base_url and model"):
                    plan(c)
                c.judge.update(dict(base_url="http://localhost:8001/v1", model="prm"))
            assert len(plan(c)) == len(c.stages)
            assert c.eval_base.policy.path == "/models/base" if name.startswith("reasonrag") else \
                c.s1_data.policy.path == "/models/base"


def test_training_row_configs_carry_the_released_settings():
    c = load("reasonrag/table3")
    assert [q["select"] for q in c.mcts.questions] == ["sample:3000:0"] * 3 and c.mcts.env.k == 3
    assert (c.mcts.mcts.max_depth, c.mcts.mcts.max_children, c.mcts.mcts.max_rollouts, c.mcts.mcts.alpha,
            c.mcts.mcts.min_margin) == (7, 2, 64, 0.9, 0.01)
    # the released code's values: judge-only selection (the policy as judge, 0-100), pairs from answered leaves
    m = c.mcts.mcts
    assert (m.value_scheme, m.rollouts_per_node, m.judge_weight, m.backup) == ("code", 0, 1.0, "all")
    assert (c.mcts.judge.kind, c.mcts.judge.path, c.mcts.judge.options.step_score_variant) == ("local", "", "code")
    assert (c.dpo.train.dpo.beta, c.dpo.train.optimizer.lr, c.dpo.epochs, c.dpo.train.lora.enabled) == (0.3, 1e-6, 1, False)
    o = c.orl_5k
    assert (o.reward, o.rl.group_size, o.rl.questions_per_step, o.rl.minibatches, o.rl.steps) == ("em", 5, 512, 2, 1005)
    assert (o.train.grpo.beta, o.train.grpo.kl_estimator, o.questions.path) == (0.001, "k3", "mcts/questions.jsonl")
    assert (o.rl.max_steps, o.rl.k, o.agent.name) == (4, 3, "reasonrag")   # Table 2's protocol
    assert [d["name"] for d in c.eval_orl_10k.datasets] == ["PopQA", "HotpotQA", "2Wiki", "Bamboogle", "MuSiQue"]
    s = load("smartsearch/table3")
    assert (s.s1_sft.train.optimizer.lr, s.s1_sft.epochs, s.s1_sft.train.lora.enabled) == (7e-6, 3, False)
    d = s.s2_dpo.train
    assert (d.dpo.beta, d.lora.rank, d.lora.alpha, len(d.lora.targets), s.s2_dpo.init) == (0.1, 8, 16.0, 7, "stage:s1_sft")
    assert (s.s2_data.refine, s.s2_data_nor.refine, s.s2_data_nor.samples, s.s1_data.rollout.temperature) == \
        (True, False, 4, 0.0)
    assert (s.s3_nor.reward, s.s3_std.reward, s.s3_nor.policy.path, s.s3_nor.rl.group_size) == \
        ("smartsearch", "smartsearch_outcome", "stage:s2_dpo", 8)
    assert s.s3_nor.retriever.index_dir == s.eval_s1.retriever.index_dir == "indexes/wiki18_e5"
    # Stage 3 / SmartSearch and w/o process rewards: the refinement rollout (released: y0 + its first refinement)
    for name, reward in (("s3", "smartsearch"), ("s3_npr", "smartsearch_outcome")):
        r = s[name]
        assert (r.reward, r.rl.group_rollout, r.rl.refine_keep_m, r.rl.refine_query_loss, r.rl.group_size,
                r.policy.path) == (reward, "smartsearch_refine", 2, True, 8, "stage:s2_dpo")
    # w/o refinement still credits every query by the PRM judge (the released code scores every trajectory); the
    # standard-GRPO row has no process reward, so no judge
    assert (s.s3_nor.rl.group_rollout, s.s3_std.rl.group_rollout, "judge" in s.s3_nor, "judge" in s.s3_std) == \
        ("independent", "independent", True, False)
    s.judge.base_url = "http://prm"   # one judge section for every data stage and the refinement rollouts
    assert s.s1_data.judge.base_url == s.s2_data_nor.judge.base_url == s.s3.judge.base_url == "http://prm"


@pytest.mark.parametrize("name, key, value, message", [
    ("reasonrag/table3", "mcts.env.bogus", 1, r"config.mcts.env: unknown keys \['bogus'\]"),
    ("reasonrag/table3", "mcts.mcts.uct", "x", r"config.mcts.mcts: MCTSConfig.uct: must be one of"),
    ("reasonrag/table3", "mcts.mcts.judge_weight", 0.5, r"config.mcts.mcts: MCTSConfig.judge_weight: must be 1.0 when"),
    ("reasonrag/table3", "mcts.judge", None, r"config.mcts.judge: mcts.judge_weight > 0 .* needs a judge"),
    ("reasonrag/table3", "mcts.mcts.value_scheme", "both", r"config.mcts.mcts: MCTSConfig.value_scheme: must be one"),
    ("reasonrag/table3", "mcts.trees_per_round", 0, r"config.mcts.trees_per_round: 0: must be >= 1"),
    ("smartsearch/table3", "s2_data.smartsearch.pairs", "some", r"config.s2_data.smartsearch: .*pairs must be"),
    ("smartsearch/table3", "s1_data.rollout.bogus", 1, r"config.s1_data.rollout: .*bogus"),
    ("smartsearch/table3", "s1_data.samples", 0, r"config.s1_data.samples: 0: must be >= 1"),
    ("smartsearch/table3", "s3.rl.group_rollout", "refine",
     r"config.s3.rl: rl config: group_rollout: 'refine' is not one of \('independent', 'smartsearch_refine'\)"),
    ("smartsearch/table3", "s3_npr.rl.refine_keep_m", 0, r"config.s3_npr.rl: rl config: refine_keep_m: must be >= 1"),
    ("smartsearch/table3", "s3_std.rl.group_rollout", "smartsearch_refine",
     r"config.s3_std.judge: rl.group_rollout 'smartsearch_refine' needs a judge section"),
])
def test_training_row_config_errors_name_the_key(name, key, value, message):
    c = load(name, "smoke")
    *parents, leaf = key.split(".")
    node = c
    for p in parents:
        node = node[p]
    node[leaf] = value
    with pytest.raises(StageError, match=message):
        plan(c)


def test_reasonrag_mcts_stage_turns_trees_into_training_rows(tmp_path):
    """reasonrag/table3's smoke mcts stage (its scripted actor: a query, or the question's last two words as the
    answer; questions 6-7 of the shared HotpotQA): Q6's gold "Terry Richardson" is those words, so its root's answer
    child (F1 1) beats its query sibling (whose answered leaves answer the same, discounted by 0.9 per step: the
    released code's bottom-up reward; selection by the stand-in judge's constant score); Q7's answer
    "metropolitan area" scores 0 like its sibling: no pair."""
    from jaxrag.supervision.mcts import read_trees

    c = load("reasonrag/table3", "smoke")
    c.stages = ["mcts"]
    assert run(c, tmp_path) == ["mcts"]
    out = tmp_path / "mcts"
    stats = json.loads((out / "stats.json").read_text())
    assert (stats["trees"], stats["questions_with_pairs"], stats["pairs"]) == (2, 1, 1)
    assert len(read_trees(out / "trees.jsonl")) == 2 and len(_rows(out / "records.jsonl")) == stats["states"]
    [row] = _rows(out / "dpo.jsonl")
    assert row["chosen"] == "So the answer is <answer>Terry Richardson</answer>"
    assert row["rejected"].startswith("So the next query is <query>") and 0 < row["margin"] < 1
    assert "Question: Who is older, Annie Morton or Terry Richardson?" in row["prompt"]   # text: a scripted actor
    assert _rows(out / "sft.jsonl") == [{"prompt": row["prompt"], "completion": row["chosen"], "qid": row["qid"],
                                         "step": 0}]
    assert [(q["question"], q["golden_answers"]) for q in _rows(out / "questions.jsonl")] == \
        [("Who is older, Annie Morton or Terry Richardson?", ["Terry Richardson"])]


def test_smartsearch_curriculum_data_stages_credit_refine_and_pair(tmp_path):
    """smartsearch/table3's smoke data stages (scripted actor: one search of 3 or 5 words, alternating per call,
    then the question's last two words if a query had more than 3 words, else its first two; stand-in judge: a query
    is useful iff it has more than 3 words, a refinement appends "biography") on shared HotpotQA questions 6-9, of
    which only Q6's last two words are its gold."""
    c = load("smartsearch/table3", "smoke")
    c.stages = ["s1_data", "s2_data"]
    assert run(c, tmp_path) == ["s1_data", "s2_data"]
    s1 = json.loads((tmp_path / "s1_data" / "stats.json").read_text())
    assert (s1["sampled"], s1["refine_requests"], s1["correct_sampled"], s1["sft"], s1["sft_outcome"]) == (8, 0, 1, 1, 1)
    [sft] = _rows(tmp_path / "s1_data" / "sft.jsonl")
    assert sft["completion"].endswith("\\boxed{Terry Richardson} </answer>")
    # s2 samples once a question: Q6 and Q8 search with 3 words (not useful: refined), Q7 and Q9 with 5
    s2 = json.loads((tmp_path / "s2_data" / "stats.json").read_text())
    assert (s2["sampled"], s2["refine_requests"], s2["refined"], s2["pairs"], s2["pairs_outcome"]) == (4, 2, 2, 2, 1)
    pairs = _rows(tmp_path / "s2_data" / "dpo.jsonl")
    assert all("biography </search>" in p["chosen"] and "biography" not in p["rejected"] for p in pairs)
    [outcome] = _rows(tmp_path / "s2_data" / "dpo_outcome.jsonl")
    assert "\\boxed{Terry Richardson}" in outcome["chosen"] and "\\boxed{Who is}" in outcome["rejected"]
    records = _rows(tmp_path / "s2_data" / "records.jsonl")
    assert len(records) == 6   # one credited search step per trajectory: 4 sampled + 2 refined
