"""The policy service: rollouts (transformers or vLLM) and the GRPO update.

`grpo.py` the loss (pure torch), `trainer.py` the update loop (one rank or many), `sharded.py` / `ranks.py` the
FSDP2 ranks (their collectives, and the processes that run them), `models.py` loading the policy and its reference,
`engine.py` / `hf_engine.py` / `vllm_engine.py` the rollout engines, `checkpoint.py` atomic checkpoints, `core.py`
the service state without gRPC, `server.py` the gRPC translation, `client.py` the orchestrator's client and
`messages.py` the dataclasses it speaks.
"""
