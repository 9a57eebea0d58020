"""The paper's tooling: `cooper experiment` and what judges and draws it.

- `experiment.py`: the reward modes on the same data, models and seeds, as `cooper train` processes.
- `reproduction.py`: the verdict, pure functions over each run's metrics records.
- `figures.py`: the over-optimisation plot and VerifyRM's health; `best_of_n.py`: the initial VerifyRM's best-of-n
  baseline, from the service cores in this process.
"""
