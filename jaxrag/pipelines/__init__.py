"""Pipelines: stage functions `fn(config, workdir, name)` that orchestrate everything below them (data, env,
retrieval, supervision, train, rl, evaluation). One folder (or module) per pipeline, plus its config file in
configs/. `common` holds what every stage shares: its directory, atomic JSON, logging, checkpoint loading."""
