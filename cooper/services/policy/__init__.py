"""The policy service: rollouts (transformers or vLLM) and the GRPO update.

`grpo.py` the loss (pure torch), `trainer.py` the update, `engine.py` / `hf_engine.py` / `vllm_engine.py` the
rollout engines, `checkpoint.py` atomic checkpoints, `core.py` the service state without gRPC, `server.py` the
gRPC translation, `client.py` the orchestrator's client.
"""
