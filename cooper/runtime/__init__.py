"""What every Cooper service shares.

- `server.py`, `client.py`, `security.py`, `healthcheck.py`: the gRPC server runtime, the client side (deadlines,
  retries on UNAVAILABLE), bearer token and TLS, the health probe.
- `processes.py`: services as child processes on free loopback ports.
- `models.py`, `devices.py`, `vllm_support.py`: model names to directories, devices and dtypes, what every vLLM engine
  needs.
- `durability.py`, `checkpoint.py`, `journal.py`, `ledger.py`, `files.py`: how a trainer keeps what it answered
  (background checkpoints, the update journal, idempotency keys, atomic files); `durable_trainer.py`: that
  bookkeeping as one piece both trainers use (the update count, keyed results, replay, checkpoint state).
"""
