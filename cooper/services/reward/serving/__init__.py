"""The reward service's HTTP API for outside users (FastAPI, the scoring fast path, the OpenAI- and vLLM-shaped
routes), apart from VerifyRM's training core: it reaches the model only through RewardService (service.py), as gRPC
(server.py) does."""
