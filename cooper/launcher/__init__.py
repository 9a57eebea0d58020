"""Starting a run on this machine: `cooper train`'s entry and what it starts when nothing is configured.

- `launch.py`: prepares the run directory and the models, starts what is missing, runs the engine, reports.
- `local.py`: the services a run needs as local processes on free ports, restarted when they die.
- `embedded_redis.py`: a redis-server child of `cooper train`, its files in the run directory.
- `plot.py`: the run's plot.png, and the alarm's marks the experiment's figures draw too.
"""
