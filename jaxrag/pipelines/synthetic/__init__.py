"""The synthetic multi-hop pipeline (configs/synthetic/pipeline.py): stage functions `fn(config, workdir, name)`.

world -> index -> teacher -> tokenizer -> sft (ReAct format) -> sft_re2search (Re²Search format, from sft) ->
supervision (process rewards) -> dpo / critic / outcome baseline -> grpo -> eval -> report. `world.py` holds the
data stages and the loaders every later stage uses; each training stage trains through jaxrag.train.fit.
"""
