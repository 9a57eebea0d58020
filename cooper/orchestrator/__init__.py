"""The run engine: one run's steps as a graph of stage jobs on Redis, and what the run leaves behind.

- `graph.py`: which jobs a step has and what each waits for (pure).
- `stages.py`: the stage jobs, plain functions of (context, step) that call the services; `stage_results.py`: what
  each records; `services.py`: the services as the stages call them, over gRPC or in this process.
- `run_store.py`: the run's jobs, statuses, results and state in Redis; `worker.py`: a stage worker.
- `run.py`: the driver of one run; `alarm_watch.py`: the reward-hacking alarm as the driver runs it.
- `data.py`: training and evaluation data; `outputs.py`: metrics.jsonl, TensorBoard events, the console summary;
  `trackers.py`: Weights & Biases and MLflow beside them (run.loggers).

It never imports the launcher (cooper/launcher/) or the experiment tooling (cooper/experiments/): they import it
(tests/test_layers.py).
"""
