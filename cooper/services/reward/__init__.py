"""The reward service: VerifyRM scores (question, reference, completion) triples and learns from preference pairs.

Where things are, from the outside in:

- `server.py`: gRPC (Score, Update, Info, Save) and `cooper serve reward`, which also starts the HTTP API.
- `serving/`: the HTTP API that outside users call, apart from the training core: `serving/http.py` (FastAPI
  routes, the scoring fast path, uvicorn) over `serving/handler.py` (the HTTP logic, no FastAPI) and
  `serving/protocol.py` (its request and response models).
- `errors.py`: every refusal and its gRPC status and HTTP status, one table for both transports.
- `service.py`: RewardService, what both transports call: tokenizes, queues, keeps the version and the metrics.
- `batcher.py`: the queue in front of the model; cuts batches, runs updates and saves between them.
- `serving_defaults.py`: the model processes, batch and wait chosen at start-up where the config leaves them unset
  (from the cores, and a short calibration of the model).
- `runner.py`: where the model runs (a thread, or a child process); `runner.apply_update(...)` and the other typed
  methods run the RewardCore method of the same name there. `model_process.py` starts that child early.
- `core.py`: RewardCore, the model's state: versions, idempotency keys, replay, checkpoints.
- `verify_rm.py`: VerifyRM, the pure core: the input template, scoring, the Bradley-Terry update; the one rule from
  a logit to a reward and a judgement is cooper/reward_rule.py, which needs no torch.
- `learner.py`: the learning mode (reward.learn_online): what HTTP scored, checked by the verifier (its in-process
  face), paired by Cooper's rule, learnt in one update per step, for trainers other than Cooper's loop.
- `replica.py`: a read replica, following the trainer's checkpoints (cooper/runtime/checkpoint.py, REWARD).
- `items.py`: the plain dataclasses every layer passes; `client.py`: the orchestrator's gRPC client;
  `inprocess.py`: the same calls over a core in the caller's process.
"""
