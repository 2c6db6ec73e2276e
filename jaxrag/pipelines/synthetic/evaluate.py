"""The synthetic pipeline's evaluation stage: every system x eval split, stratified by question type.

config[name].systems: a list of {"name", "agent", "model"} (model = the stage whose model/ is loaded); optional
"critic" (a critic stage: PRM-guided best-of-N with "n" candidates at temperature "temperature"); only (comma-separated
system names to run, "" = all: a study that trains a few stages evaluates those alone). Baseline agents
(direct, rag) run the same model made to answer at once (ForcedAnswerPolicy), so they differ from the search agent
only in how much retrieval they get. Outputs: episodes_<system>_<split>.jsonl and results.json under workdir/<name>/
(each split's metrics, and under "errors" where its failures come from: jaxrag.pipelines.synthetic.taxonomy).
"""

from __future__ import annotations

import collections
import dataclasses
import time

from jaxrag.console import num, standard_error
from jaxrag.env.agents import get_agent
from jaxrag.env.mdp import write_episodes
from jaxrag.env.rollout import rollout
from jaxrag.evaluate import episode_metrics
from jaxrag.pipelines.common import log, stage_dir, write_json
from jaxrag.pipelines.synthetic import checks
from jaxrag.pipelines.synthetic.preference import critic_select
from jaxrag.pipelines.synthetic.taxonomy import taxonomy
from jaxrag.pipelines.synthetic.world import (load_questions, load_tokenizer, make_retriever, rollout_config,
                                              stage_policy)
from jaxrag.train.distributed import lead_only

FORCED_ANSWER_AGENTS = ("direct", "rag")


@dataclasses.dataclass
class ForcedAnswerPolicy:
    """A Policy wrapper that makes the model answer now: the prompt ends with the agent's answer prefix and the
    completion is returned with it."""

    policy: object
    prefix: str = "answer:"

    def generate(self, prompts, **kw):
        out = self.policy.generate([p + self.prefix for p in prompts], **kw)
        return [[dataclasses.replace(c, text=self.prefix + c.text) for c in row] for row in out]


def score_episodes(episodes, questions: dict[str, dict]) -> dict:
    """jaxrag.evaluate.episode_metrics over all episodes, per question type and per hop count."""
    by_type, by_hops = collections.defaultdict(list), collections.defaultdict(list)
    for ep in episodes:
        meta = questions[ep.qid]["metadata"]
        by_type[meta["type"]].append(ep)
        by_hops[str(meta["hops"])].append(ep)
    return {
        "all": episode_metrics(episodes),
        "by_type": {t: episode_metrics(by_type[t]) for t in sorted(by_type)},
        "by_hops": {h: episode_metrics(by_hops[h]) for h in sorted(by_hops)},
    }


def stratified(questions: list[dict], limit: int) -> list[dict]:
    """At most `limit` questions, split evenly over question types (in file order within a type); 0 = all."""
    if not limit:
        return questions
    by_type = collections.defaultdict(list)
    for q in questions:
        by_type[q["metadata"]["type"]].append(q)
    per_type = -(-limit // len(by_type))
    keep = {q["id"] for qs in by_type.values() for q in qs[:per_type]}
    return [q for q in questions if q["id"] in keep]


def selected_systems(s) -> list[dict]:
    """The eval section's systems named in its `only` list (all when it is empty), in the section's order."""
    only = [x.strip() for x in str(s.get("only") or "").split(",") if x.strip()]
    return [system for system in s.systems if not only or system["name"] in only]


@lead_only  # host-side: process 0 alone (docs/multihost.md)
def eval_stage(config, workdir, name) -> None:
    s = config[name]
    tok = load_tokenizer(workdir)
    retriever = make_retriever(config, workdir)
    policies: dict = {}
    out = stage_dir(workdir, name)
    results = {"seed": config.seed, "k": config.index.k, "systems": {}}
    for system in selected_systems(s):
        agent = get_agent(system["agent"], mode="plain")
        if system["model"] not in policies:  # each stage's model loaded once
            policies[system["model"]] = stage_policy(workdir, system["model"], tok, config.get("sampler"))
        policy = policies[system["model"]]
        if system["agent"] in FORCED_ANSWER_AGENTS:
            policy = ForcedAnswerPolicy(policy)
        select, rcfg = None, rollout_config(config, s, progress=True)
        if system.get("critic"):
            select = critic_select(workdir, system["critic"], tok, agent, config.get("sampler"))
            rcfg = dataclasses.replace(rcfg, n_candidates=system["n"], temperature=system.get("temperature", 1.0))
        entry = {k: v for k, v in system.items() if k != "name"}
        results["systems"][system["name"]] = {**entry, "splits": {}}
        for split in s.splits:
            qs = stratified(load_questions(workdir, split), s.max_questions)
            t0 = time.perf_counter()
            episodes = rollout(policy, retriever, agent, qs, rcfg, select=select)
            write_episodes(out / f"episodes_{system['name']}_{split}.jsonl", episodes)
            by_id = {q["id"]: q for q in qs}
            scored = score_episodes(episodes, by_id)
            scored["errors"] = taxonomy(episodes, by_id)
            scored["seconds"] = round(time.perf_counter() - t0, 2)
            results["systems"][system["name"]]["splits"][split] = scored
            a = scored["all"]
            log(name, f"{system['name']} {split}: EM {num(a['em'])} ± {num(standard_error(a['em'], a['n']))} "
                      f"(n {a['n']}), F1 {num(a['f1'])}, searches {num(a['searches_mean'])}, "
                      f"invalid {num(a['invalid_rate'])}, {scored['seconds']:.0f} s")
    write_json(out / "results.json", results)


# jaxrag.main checks the config before any stage runs
eval_stage.check_config = checks.check_eval
