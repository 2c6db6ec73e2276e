"""The synthetic multi-hop pipeline (configs/synthetic/pipeline.py): stage functions `fn(config, workdir, name)`.

world -> index -> teacher -> tokenizer -> sft (ReAct format) -> supervision (process rewards) -> dpo / critic /
outcome baseline -> grpo -> agreement / bestofn -> eval -> report; configs/synthetic/findings.py adds sft_re2search
(the Re²Search format, from sft) and the studies. `world.py` holds the data stages and the loaders every later stage
uses; each training stage trains through jaxrag.train.fit.
"""
