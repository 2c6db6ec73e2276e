"""The sampling stack: text prompts in, sampled completions (ids, text, per-token log-probs) out.

Import from here what callers use; the modules hold the details:
  generate     the jitted batched sampler (prefill + decode chunks, cascade over a prompt's n samples, mesh layout)
  sessions     cross-turn KV reuse: a session pool that prefills only the tokens a prompt appends
  continuous   continuous batching: a fixed pool of decode slots refilled after every decode chunk
  policy       the Policy protocol and JaxPolicy, the text-level face over the three above
"""
from jaxrag.sampling.continuous import RequestTooLong, SlotPool
from jaxrag.sampling.generate import Completions, SamplingParams, bucket, fork, left_pad, place_for_decode, sample
from jaxrag.sampling.policy import Completion, ContinuousSession, JaxPolicy, Policy
from jaxrag.sampling.sessions import MIN_SHARED, PoolFull, SessionPool, extends, shared_prefix

__all__ = ["Completion", "Completions", "ContinuousSession", "JaxPolicy", "MIN_SHARED", "Policy", "PoolFull",
           "RequestTooLong", "SamplingParams", "SessionPool", "SlotPool", "bucket", "extends", "fork", "left_pad",
           "place_for_decode", "sample", "shared_prefix"]
