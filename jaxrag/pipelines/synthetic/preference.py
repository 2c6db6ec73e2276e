"""Training on process-level preference pairs: DPO of the policy, and a Bradley–Terry critic (PRM) for best-of-N.

config[name]: pairs (the supervision stage whose pairs.jsonl to read), init (the stage whose model starts training:
the SFT policy; for DPO it is also the frozen reference), max_len, and `train` (the trainer config; its loss is
"dpo" or "bt"). Both train through jaxrag.train.fit and save workdir/<name>/model (the critic with head.npz).
"""

from __future__ import annotations

from pathlib import Path

from jaxrag import tokenizer
from jaxrag.console import summary
from jaxrag.pipelines.common import load_checkpoint, log, model_dir, stage_dir, write_json
from jaxrag.pipelines.synthetic import checks
from jaxrag.pipelines.synthetic.world import load_tokenizer, tokenizer_path
from jaxrag.pipelines.train import train_on_examples
from jaxrag.supervision import critic
from jaxrag.supervision.records import pair_examples, read_pairs
from jaxrag.train import config as tconfig, objectives
from jaxrag.train.distributed import is_lead


def pair_examples_of(workdir, s, tok) -> tuple[list, dict]:
    """The supervision stage's pairs as PreferencePair ids (prompt masked); over-long pairs (prompt + the longer
    action > max_len) are dropped and counted."""
    pairs = read_pairs(Path(workdir) / s.pairs / "pairs.jsonl")
    if not pairs:
        raise ValueError(f"{Path(workdir) / s.pairs / 'pairs.jsonl'}: empty (the supervision stage found no pairs)")
    examples = pair_examples(pairs, tok)
    kept = [e for e in examples if len(e.prompt) + max(len(e.chosen), len(e.rejected)) <= s.max_len]
    if not kept:
        raise ValueError(f"no preference pair fits max_len={s.max_len}")
    return kept, {"pairs": len(pairs), "kept": len(kept)}


def preference_stage(config, workdir, name) -> None:
    """A paired loss (train.loss: "dpo", the Bradley–Terry critic "bt", or any Objective whose layout is "pairs",
    e.g. "module:simpo") on the supervision stage's pairs, through the generic stage's training path
    (jaxrag.pipelines.train.train_on_examples; `train_layout`, default "rows")."""
    s = config[name]
    tc = tconfig.resolve(s.train)
    layout = objectives.objective(tc).layout
    if layout != "pairs":
        raise ValueError(f"config.{name}.train.loss={tc.loss!r}: the preference stage trains a paired loss (layout "
                         f"'pairs': dpo, bt, ...), not one of layout {layout!r}")
    tok = load_tokenizer(workdir)
    examples, info = pair_examples_of(workdir, s, tok)
    info["batch_size"] = min(tc.batch_size, len(examples))
    if info["batch_size"] != tc.batch_size:
        with tc.unlocked():
            tc.batch_size = info["batch_size"]
    mcfg, params = load_checkpoint(model_dir(workdir, s.init))
    log(name, f"{tc.loss} on " + summary(info) + f", {tc.steps} steps")
    result = train_on_examples(mcfg, params, examples, tc, workdir, name, layout=s.get("train_layout", "rows"),
                               pad_id=tok.pad_id, tokenizer_file=tokenizer_path(workdir))
    if is_lead():  # every process trained and saved together; one writes the summary
        write_json(stage_dir(workdir, name) / "summary.json", {**info, "steps": result.step, "final": result.metrics})
    log(name, f"{result.step} steps, last batch: " + summary(result.metrics, (
        "loss", f"{tc.loss}/accuracy", "dpo/reward_margin", "bt/margin")))


def critic_scorer(workdir, stage: str, agent=None, shapes=None):
    """A CriticScorer over workdir/<stage>/model (backbone + head.npz) with the checkpoint's own tokenizer; shapes:
    the config's optional `sampler` section (its min_rows floors the scorer's batches too: world.stage_policy)."""
    mcfg, params, head = load_checkpoint(model_dir(workdir, stage), with_head=True)
    if head is None:
        raise FileNotFoundError(f"{model_dir(workdir, stage)}: no head.npz (is '{stage}' a critic stage?)")
    # each state's prompt computed once for its N candidates (share_prefix, the library default): the same picks in
    # less than half the scoring time on the demo's best-of-4 (docs/demo.md, "Where the rest of the time goes")
    tok = tokenizer.load_tokenizer(model_dir(workdir, stage))
    return critic.CriticScorer(mcfg, params, head, tok, agent, batch_size=128,
                               min_rows=dict(shapes or {}).get("min_rows", 1))


def critic_select(workdir, stage: str, tok, agent, shapes=None):
    """The rollout engine's `select` for PRM-guided best-of-N (RAG-Gym Alg. 1): execute argmax_a r_φ(s, a)."""
    return critic.critic_select(critic_scorer(workdir, stage, agent, shapes))


# jaxrag.main checks the config before any stage runs
preference_stage.check_config = checks.check_stage
