"""The reward model behind LitServe (FastAPI + uvicorn in front, the model in a worker process): a peer for
bench/reward_http.py.

LitServe's batching: at most COOPER_BENCH_MAX_BATCH requests (default 64), waiting at most COOPER_BENCH_MAX_WAIT_MS
(default 5); COOPER_BENCH_WORKERS model worker processes (workers_per_device on the one CPU device, default 1);
COOPER_BENCH_API_SERVERS API server processes in front (default: as many as workers, LitServe's own default);
`fast_queue` (ZeroMQ between the front and the worker, which LitServe's docstring recommends above 100 requests/s)
when COOPER_BENCH_FAST_QUEUE=1. bench/reward_http.py sweeps all five and reports LitServe at its best.
decode_request tokenizes each request with the project's Encoder, predict scores the batch (bench/peers/model.py, the
project's own code). Same route, request and answer as the service's POST /v1/score. Left out: auth, limits,
versions; a peer only needs to score.

    COOPER_BENCH_MODEL_DIR=... PYTHONPATH=. ~/.cache/cooper/bench-peers/litserve/bin/python bench/peers/litserve_server.py 8000
"""

import os
import sys
from typing import Any

import litserve as ls


class RewardAPI(ls.LitAPI):
    def setup(self, device: str) -> None:
        from bench.peers.model import BenchModel

        self.model = BenchModel()

    def decode_request(self, request: dict[str, Any]) -> list[list[int]]:
        return self.model.encode(request["items"])

    def batch(self, inputs: list[list[list[int]]]) -> list[list[list[int]]]:
        return inputs

    def predict(self, requests: list[list[list[int]]]) -> list[list[dict[str, float]]]:
        # one entry per request, each a list of token lists: score all rows in one batch, answer per request
        scores = self.model.score_tokens([tokens for request in requests for tokens in request])
        answers, start = [], 0
        for request in requests:
            answers.append(scores[start : start + len(request)])
            start += len(request)
        return answers

    def unbatch(self, output: list[list[dict[str, float]]]) -> list[list[dict[str, float]]]:
        return output

    def encode_response(self, output: list[dict[str, float]]) -> dict[str, Any]:
        return {"scores": output}


if __name__ == "__main__":
    api = RewardAPI(max_batch_size=int(os.environ.get("COOPER_BENCH_MAX_BATCH", "64")),
                    batch_timeout=float(os.environ.get("COOPER_BENCH_MAX_WAIT_MS", "5")) / 1000, api_path="/v1/score")
    # On CPU there is one device: workers_per_device is the number of model workers, as mosec's COOPER_BENCH_WORKERS
    # inference workers. run() starts as many API servers by default; one front for two workers is swept too.
    workers = int(os.environ.get("COOPER_BENCH_WORKERS", "1"))
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=workers, timeout=60,
                          fast_queue=os.environ.get("COOPER_BENCH_FAST_QUEUE") == "1")
    server.run(host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", generate_client_file=False,
               num_api_servers=int(os.environ.get("COOPER_BENCH_API_SERVERS", str(workers))))
