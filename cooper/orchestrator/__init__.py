"""The run: config, data, the step graph on Redis, checkpoints, evaluation, metrics and the CLI's `train`."""
