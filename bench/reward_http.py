"""Reward serving over HTTP: Cooper's reward service against a naive one-forward-per-request server.

32 concurrent clients each send one item per request until 2,000 items are scored, against (a) a naive FastAPI
server written below, the way most reward servers are written (parse the JSON, tokenize, one forward pass per
request, answer), and (b) `cooper serve reward` (dynamic batching over all concurrent requests). Both load the same
tiny VerifyRM and build the same VerifyRM input text. Both run as processes of their own, started once; timed
rounds alternate between them (only one is under load at a time) so that both see the same background load, and
medians over rounds are reported. Both get the same torch thread count (--threads, default 1: on a small CPU, one
intra-op thread is fastest for a batch-1 forward, so this favours the naive server if anything) and the same event
loop (uvicorn picks uvloop for the naive server when installed; --loop auto does the same for the service).

The client is a minimal asyncio HTTP/1.1 client on keep-alive connections: on a small machine a heavy client
library would take the CPU that the servers need and flatten the difference it is meant to measure. Both servers
get the same client.

Printed last, one JSON line: throughput (items/s) and p50/p99 request latency (ms) of both, "ratio" = service /
naive throughput (and per round), the service's mean batch, the 1-minute load average at the end (the numbers
mean little on a machine that other jobs keep busy), and the largest score and logit difference between the two
servers on the same items. Also what batching can give at most on this machine: the model's own time per item
in this process, one at a time and in batches of 16 (tokenized beforehand, same thread count), and
"ceiling_ratio" = the batched model's items/s over the naive server's measured items/s, the ratio a service would
reach if HTTP, tokenizing and the client cost nothing and the model never waited. It is measured in a quiet
process, so it is an upper bound: on the 2-vCPU cloud machine this was written on, busy work on one vCPU (the
service's HTTP side, the client; measured with a tokenizer loop and with a second model) slowed the model's
forward passes on the other by 1.3-1.8x.

    python bench/reward_http.py [--items 2000] [--clients 32] [--rounds 3] [--threads 1] [--loop auto] [--device cpu]
"""

import argparse
import asyncio
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_items(n: int, seed: int = 0) -> list[dict[str, str]]:
    """Tiny-task items: right and wrong solutions with filler of varied length, so batches need padding."""
    from cooper.tiny.task import make_split, wrong_solution

    rng = random.Random(seed)
    items = []
    for problem in make_split(n, seed, "bench"):
        completion = problem.solution if rng.random() < 0.5 else wrong_solution(problem, rng)
        completion = "Let me think. " * rng.randint(0, 6) + completion
        items.append({"question": problem.question, "reference": problem.answer, "completion": completion})
    return items


# ----- (a) the naive server -----


def naive_server(port_file: str) -> None:
    """FastAPI + uvicorn, one forward pass per request: the usual remote reward server."""
    import socket

    import torch
    import uvicorn
    from fastapi import FastAPI, Request
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from cooper.services.reward.verify_rm import format_input
    from cooper.tiny.models import resolve_model

    path = resolve_model(os.environ.get("COOPER_BENCH_MODEL", "tiny"), "reward")
    device = os.environ.get("COOPER_BENCH_DEVICE", "cpu")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval().to(device)
    app = FastAPI()

    # (FastAPI reads the annotation `Request` below, so this module must not use postponed annotations.)

    @app.post("/v1/score")
    async def score(request: Request) -> dict:
        data = await request.json()
        texts = [format_input(i["question"], i["reference"], i["completion"]) for i in data["items"]]
        batch = tokenizer(texts, return_tensors="pt", padding=True).to(device)
        with torch.no_grad():
            logits = model(**batch).logits[:, 0].float()
        return {"scores": [{"score": torch.sigmoid(x).item(), "logit": x.item()} for x in logits]}

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)  # connections wait in the backlog until uvicorn accepts them
    Path(port_file).write_text(str(sock.getsockname()[1]))
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


# ----- the client -----


class Connection:
    """One keep-alive HTTP/1.1 connection; enough of the protocol for JSON POSTs to these two servers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str):
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, host: str, port: int) -> "Connection":
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer, host)

    async def post(self, path: str, payload: dict) -> dict:
        return json.loads(await self.request("POST", path, json.dumps(payload).encode()))

    async def request(self, method: str, path: str, body: bytes = b"") -> bytes:
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        data = await self.reader.readexactly(length)
        if b" 200 " not in status_line:
            raise RuntimeError(f"{path}: {status_line.decode().strip()} {data[:300]!r}")
        return data

    def close(self) -> None:
        self.writer.close()


def mean_of(metrics: str, name: str) -> float | None:
    """Mean of a Prometheus histogram from its _sum and _count lines."""
    values = {}
    for line in metrics.splitlines():
        for suffix in ("_sum", "_count"):
            if line.startswith(name + suffix + " "):
                values[suffix] = float(line.split()[-1])
    return values["_sum"] / values["_count"] if values.get("_count") else None


async def drive(port: int, items: list[dict[str, str]], clients: int, warmup: int, with_metrics: bool) -> dict:
    """`clients` connections take items from one shared cursor, one item per request."""
    connections = [await Connection.open("127.0.0.1", port) for _ in range(clients)]

    async def warm(connection: Connection, offset: int) -> None:
        for i in range(max(1, warmup // clients)):
            await connection.post("/v1/score", {"items": [items[(offset + i * clients) % len(items)]]})

    await asyncio.gather(*(warm(c, i) for i, c in enumerate(connections)))
    cursor = iter(range(len(items)))
    logits: list[float] = [0.0] * len(items)
    scores: list[float] = [0.0] * len(items)
    latencies: list[float] = []

    async def worker(connection: Connection) -> None:
        for index in cursor:
            start = time.perf_counter()
            reply = await connection.post("/v1/score", {"items": [items[index]]})
            latencies.append(time.perf_counter() - start)
            scores[index] = reply["scores"][0]["score"]
            logits[index] = reply["scores"][0]["logit"]

    start = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in connections))
    wall = time.perf_counter() - start
    metrics = (await connections[0].request("GET", "/metrics")).decode() if with_metrics else ""
    for c in connections:
        c.close()
    latencies.sort()
    return {
        "throughput": len(items) / wall, "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], "wall_s": wall,
        "scores": scores, "logits": logits, "mean_batch": mean_of(metrics, "cooper_reward_batch_items") or 0,
    }


def model_ms_per_item(model: str, items: list[dict[str, str]], threads: int, device: str) -> dict[str, float]:
    """The bare model's time per item (median of 3 passes), one item per forward and 16 per forward."""
    import torch

    from cooper.config import OptimConfig
    from cooper.services.reward.verify_rm import ScoreItem, VerifyRM
    from cooper.tiny.models import resolve_model

    torch.set_num_threads(threads)
    rm = VerifyRM.load(resolve_model(model, "reward"), OptimConfig(), device=device, dtype="float32")
    tokens = rm.encode([ScoreItem(**item) for item in items])
    result = {}
    for name, batch_size, rows in (("single", 1, tokens[:300]), ("batch16", 16, tokens)):
        times = []
        for _ in range(3):
            start = time.perf_counter()
            rm.logits(rows, batch_size)
            times.append((time.perf_counter() - start) / len(rows))
        result[name] = 1000 * statistics.median(times)
    return result


def wait_for_file(path: Path, process: subprocess.Popen, what: str, timeout_s: float = 120) -> str:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if path.exists() and path.read_text():
            return path.read_text()
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} during start-up")
        time.sleep(0.1)
    raise TimeoutError(f"{what} not ready after {timeout_s} s")


def service_launcher(loop: str) -> list[str]:
    """`cooper serve` on the event loop the naive server gets from uvicorn: uvloop when installed ("auto")."""
    if loop == "asyncio" or (loop == "auto" and importlib.util.find_spec("uvloop") is None):
        return [sys.executable, "-m", "cooper.cli"]
    return [sys.executable, "-c", "import asyncio, sys, uvloop; asyncio.set_event_loop_policy(uvloop.EventLoopPolicy());"
            " from cooper.cli import main; sys.exit(main(sys.argv[1:]))"]


def start_server(command: list[str], ready: Path, what: str, threads: int) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(threads))
    process = subprocess.Popen(command, cwd=ROOT, env=env)
    try:
        return process, wait_for_file(ready, process, what)
    except BaseException:
        process.terminate()
        raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--model", choices=["tiny", "small"], default="tiny",
                        help="tiny (0.1M parameters, the default) or small (4M: a forward pass with some compute in it)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="alternating timed rounds per server; medians reported")
    parser.add_argument("--warmup", type=int, default=128, help="requests sent before each timed round")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads of both servers (OMP_NUM_THREADS); one is fastest on small CPUs")
    parser.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto",
                        help="event loop of the service; auto = uvloop when installed, as uvicorn picks for the naive "
                             "server")
    parser.add_argument("--device", default="cpu",
                        help="where both servers run the model (cpu, cuda, cuda:N); float32 on both either way")
    parser.add_argument("--naive-server", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.naive_server:
        naive_server(args.naive_server)
        return

    from cooper.tiny.models import resolve_model

    resolve_model(args.model, "reward")  # build the model once, before either server starts
    os.environ["COOPER_BENCH_MODEL"] = args.model  # the naive server (a child process) loads the same one
    os.environ["COOPER_BENCH_DEVICE"] = args.device
    items = make_items(args.items)
    runs: dict[str, list[dict]] = {"naive": [], "service": []}
    with tempfile.TemporaryDirectory(prefix="cooper-bench-") as tmp:
        naive_ready, service_ready = Path(tmp) / "naive.port", Path(tmp) / "service.json"
        naive, naive_port = start_server(
            [sys.executable, __file__, "--naive-server", str(naive_ready)], naive_ready, "naive server", args.threads)
        try:
            service, ready = start_server(
                [*service_launcher(args.loop), "--log-level", "WARNING", "serve", "reward", "--port", "0",
                 "--ready-file", str(service_ready), "reward.http.port=0", f"reward.checkpoint_dir={tmp}/ckpt",
                 "reward.server.metrics_port=null", f"reward.model={args.model}", f"reward.device={args.device}",
                 "reward.dtype=float32"],
                service_ready, "reward service", args.threads)
            try:
                ports = {"naive": int(naive_port), "service": json.loads(ready)["http_port"]}
                # Alternate rounds so that both servers see the same background load; only one runs at a time.
                for _ in range(args.rounds):
                    for name in ("naive", "service"):
                        runs[name].append(asyncio.run(drive(ports[name], items, args.clients, args.warmup,
                                                            with_metrics=name == "service")))
            finally:
                service.terminate()
                service.wait(timeout=60)
        finally:
            naive.terminate()
            naive.wait(timeout=60)

    def median_of(name: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[name])

    score_diff = max(abs(a - b) for n, s in zip(runs["naive"], runs["service"], strict=True)
                     for a, b in zip(n["scores"], s["scores"], strict=True))
    logit_diff = max(abs(a - b) for n, s in zip(runs["naive"], runs["service"], strict=True)
                     for a, b in zip(n["logits"], s["logits"], strict=True))
    naive_tp, service_tp = median_of("naive", "throughput"), median_of("service", "throughput")
    model_ms = model_ms_per_item(args.model, items, args.threads, args.device)  # after the servers stopped: a quiet process
    result = {
        "bench": "reward_http", "model": args.model, "items": args.items, "clients": args.clients, "items_per_request": 1,
        "rounds": args.rounds, "threads": args.threads, "device": args.device, "service_loop": args.loop, "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "naive_items_per_s": round(naive_tp, 1), "service_items_per_s": round(service_tp, 1),
        "naive_p50_ms": round(median_of("naive", "p50_ms"), 2), "naive_p99_ms": round(median_of("naive", "p99_ms"), 2),
        "service_p50_ms": round(median_of("service", "p50_ms"), 2),
        "service_p99_ms": round(median_of("service", "p99_ms"), 2),
        "ratio": round(service_tp / naive_tp, 2),
        "ratio_per_round": [round(s["throughput"] / n["throughput"], 2)
                            for n, s in zip(runs["naive"], runs["service"], strict=True)],
        "service_mean_batch": round(median_of("service", "mean_batch"), 1),
        "model_ms_per_item_single": round(model_ms["single"], 3),
        "model_ms_per_item_batch16": round(model_ms["batch16"], 3),
        "ceiling_ratio": round(1000 / model_ms["batch16"] / naive_tp, 2),
        "max_score_diff": score_diff, "max_logit_diff": logit_diff,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
