"""Judging a reward model, pure where it can be.

- `monitor.py`: AUROC and false-positive rates on a step's scores (pure).
- `alarm.py`, `alarm_threshold.py`, `exploit_check.py`: the reward-hacking alarm's detector, its calibrated threshold
  and its absolute check (pure).
- `rm_bench.py`: VerifyRM and the rule verifier on a labelled benchmark in VerifyBench's format (`cooper eval-rm`,
  eval.rm_benchmark_path); its scoring functions load the model or call the services.
"""
