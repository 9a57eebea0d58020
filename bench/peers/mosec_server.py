"""The reward model behind mosec (a Rust HTTP front and Python worker processes): a peer for bench/reward_http.py.

Set up the way mosec's own examples serve a classifier: a tokenizing stage (COOPER_BENCH_TOKENIZERS processes,
default 1; batched like the next stage when COOPER_BENCH_TOKENIZE_BATCHED=1, one request at a time otherwise) feeding
a batched inference stage (COOPER_BENCH_WORKERS processes, default 1; mosec's dynamic batching, at most
COOPER_BENCH_MAX_BATCH requests, default 64, waiting at most COOPER_BENCH_MAX_WAIT_MS, default 5).
bench/reward_http.py sweeps all five and reports mosec at its best. Same request and answer as the
service's POST /v1/score ({"items": [...]} -> {"scores": [{"score", "logit"}]}), on mosec's route /inference.
Model and tokens: bench/peers/model.py, the project's own code. Left out: auth, limits, versions; a peer only needs
to score.

    COOPER_BENCH_MODEL_DIR=... PYTHONPATH=. ~/.cache/cooper/bench-peers/mosec/bin/python bench/peers/mosec_server.py --port 8000
"""

import os
from typing import Any

from mosec import Server, Worker


class Tokenize(Worker):
    def __init__(self) -> None:
        super().__init__()
        from bench.peers.model import MAX_LENGTH
        from cooper.services.reward.items import ScoreItem
        from cooper.services.reward.verify_rm import Encoder

        self.item = ScoreItem
        self.encoder = Encoder.load(os.environ["COOPER_BENCH_MODEL_DIR"], MAX_LENGTH)

    def forward(self, data: dict[str, Any]) -> list[list[int]]:
        return self.encoder.encode([self.item(i["question"], i["reference"], i["completion"]) for i in data["items"]])


class TokenizeBatch(Tokenize):
    """The tokenizing stage batched: mosec hands it a list of requests, and it answers one list of token lists each
    (one call of the fast tokenizer over all their items)."""

    def forward(self, data: list[dict[str, Any]]) -> list[list[list[int]]]:  # type: ignore[override]
        items = [self.item(i["question"], i["reference"], i["completion"]) for request in data
                 for i in request["items"]]
        ids = self.encoder.encode(items)
        answers, start = [], 0
        for request in data:
            answers.append(ids[start : start + len(request["items"])])
            start += len(request["items"])
        return answers


class Score(Worker):
    def __init__(self) -> None:
        super().__init__()
        from bench.peers.model import BenchModel

        self.model = BenchModel()

    def forward(self, data: list[list[list[int]]]) -> list[dict[str, Any]]:
        # one entry per request, each a list of token lists: score all rows in one batch, answer per request
        rows = [tokens for request in data for tokens in request]
        scores = self.model.score_tokens(rows)
        answers, start = [], 0
        for request in data:
            answers.append({"scores": scores[start : start + len(request)]})
            start += len(request)
        return answers


if __name__ == "__main__":
    batching = {"max_batch_size": int(os.environ.get("COOPER_BENCH_MAX_BATCH", "64")),
                "max_wait_time": int(float(os.environ.get("COOPER_BENCH_MAX_WAIT_MS", "5")))}
    tokenizers = int(os.environ.get("COOPER_BENCH_TOKENIZERS", "1"))
    server = Server()
    if os.environ.get("COOPER_BENCH_TOKENIZE_BATCHED") == "1":
        server.append_worker(TokenizeBatch, num=tokenizers, **batching)
    else:
        server.append_worker(Tokenize, num=tokenizers)
    server.append_worker(Score, num=int(os.environ.get("COOPER_BENCH_WORKERS", "1")), **batching)
    server.run()
