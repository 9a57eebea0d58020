"""The usual remote reward server, a peer for bench/reward_http.py: FastAPI + uvicorn, one forward pass per request,
written as a careful user would write it: KV cache off (a classifier never decodes), inference_mode, the fast
tokenizer's own Rust call, the bench's thread count. COOPER_BENCH_WORKERS uvicorn worker processes (default 1), each
a whole copy of the model, as the service's model processes and mosec's and LitServe's workers: bench/reward_http.py
sweeps 1 and 2 where there are cores for two. Runs in the project's own environment (it needs nothing more).

    COOPER_BENCH_MODEL_DIR=... PYTHONPATH=. python bench/peers/naive_server.py 8000
"""

import os
import sys

from fastapi import FastAPI, Request


def create_app() -> FastAPI:
    """The app of one worker process: its own model and tokenizer."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from cooper.reward_rule import logit_to_reward
    from cooper.services.reward.verify_rm import format_input

    path = os.environ["COOPER_BENCH_MODEL_DIR"]
    device = os.environ.get("COOPER_BENCH_DEVICE", "cpu")
    torch.set_num_threads(int(os.environ.get("COOPER_BENCH_THREADS", "1")))
    tokenizer = AutoTokenizer.from_pretrained(path).backend_tokenizer
    tokenizer.encode_special_tokens = True  # the text is data: no special tokens read out of it
    # float32 as every server here: left to transformers, a model saved in bfloat16 would load as such.
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval().to(device)
    app = FastAPI()

    # (FastAPI reads the annotation `Request` below, so this module must not use postponed annotations.)

    @app.post("/v1/score")
    async def score(request: Request) -> dict:
        data = await request.json()
        scores = []
        for i in data["items"]:  # one request holds one item here: no padding
            ids = tokenizer.encode(format_input(i["question"], i["reference"], i["completion"])).ids
            with torch.inference_mode():
                logit = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0, 0].float()
            scores.append({"score": logit_to_reward(logit.item()), "logit": logit.item()})
        return {"scores": scores}

    return app


if __name__ == "__main__":
    import uvicorn

    # An import string and a factory: uvicorn's workers each import and build their own app.
    uvicorn.run("bench.peers.naive_server:create_app", factory=True, host="127.0.0.1", port=int(sys.argv[1]),
                workers=int(os.environ.get("COOPER_BENCH_WORKERS", "1")), log_level="warning", backlog=256)
