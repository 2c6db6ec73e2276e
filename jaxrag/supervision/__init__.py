"""Process supervision (host side, above env/, generate and train/): the four papers' reward sources, judges and
preference data. `records` is the one data model; `rewards` the registry of episode reward functions."""
