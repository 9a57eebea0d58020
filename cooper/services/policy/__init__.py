"""The policy service: rollouts (transformers or vLLM) and the GRPO update.

- `grpo.py`: the loss (pure torch); `trainer.py`: the update loop; `models.py`: loading the reference;
  `updaters.py`: where updates run (this process or the ranks); `checks.py`: what a Train's rollout must satisfy.
- `ranks/`, `sharded.py`, `placement.py`, `errors.py`: the FSDP2 ranks (their processes and collectives, one rank's
  share of an update, where a process sits in the group, how a rank fails).
- `engine.py`, `hf_engine.py`, `vllm_engine.py`: the rollout engines; `sampler.py`: the two sampling routes (the
  trainer's weights, or a version behind them); `rollout_process.py`: an engine in a process of its own.
- `core.py`: the service's state without gRPC; `server.py`: the gRPC translation; `client.py`: the orchestrator's
  client; `inprocess.py`: the same calls over a core in the caller's process; `messages.py`: the dataclasses they
  speak.
"""
