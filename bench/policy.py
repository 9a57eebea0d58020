"""Policy service over gRPC vs the same engine and trainer in-process, on the tiny model.

    python bench/policy.py [--rounds 15] [--prompts 8] [--n 4] [--max-new-tokens 32] [--threads 1]

The baseline is `PolicyCore` called directly in this process; the service is `cooper serve policy` in a
subprocess with the same config (same model, seed, thread count), reached through `PolicyClient` on loopback.
Rounds alternate which side goes first, so drift in machine load hits both alike.
- Generate: completion tokens per second of one request (prompts x n completions), same seeds on both sides, so
  both sample the very same tokens (weights are identical until training starts).
- Train: seconds per GRPO update on the same rollout and rewards; both sides apply the same sequence of updates.
Ratios are service speed / in-process speed (1.0 = no overhead). The last line is one JSON object.

    python bench/policy.py --world-size 2 [--rounds 15] ...

With --world-size N > 1 it compares training instead: seconds per GRPO update of a 1-rank core and an N-rank core
(FSDP2; gloo on the CPU, each rank with --threads torch threads), both in this process, on the same rollout and
rewards, rounds alternating. On a CPU with a tiny model the N-rank step is slower, not faster: its all-gathers and
reduce-scatters cost more than the compute they split. The figure that matters is on GPUs with a large model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cooper.config import PolicyConfig
from cooper.services.policy.client import PolicyClient
from cooper.services.policy.core import PolicyCore
from cooper.services.policy.engine import SamplingParams
from cooper.services.policy.trainer import RolloutSample
from cooper.tiny.task import make_split

OVERRIDES = {
    "model": "tiny",
    "device": "cpu",
    "optim.lr": 1e-4,
    "optim.warmup_steps": 0,
    "optim.micro_batch_size": 16,
    "server.metrics_port": None,
}


def start_service(workdir: Path, threads: int) -> tuple[subprocess.Popen[bytes], str]:
    ready = workdir / "policy.json"
    settings = {**OVERRIDES, "checkpoint_dir": str(workdir / "service-ckpt"), "torch_threads": threads}
    args = [f"policy.{k}={'null' if v is None else v}" for k, v in settings.items()]
    proc = subprocess.Popen([sys.executable, "-m", "cooper.cli", "--log-level", "WARNING", "serve", "policy",
                             "--port", "0", "--ready-file", str(ready), *args])
    end = time.monotonic() + 180
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > end:
            proc.kill()
            raise SystemExit("bench: the policy service did not start")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{json.loads(ready.read_text())['grpc_port']}"


def in_process_core(workdir: Path, threads: int, world_size: int = 1) -> PolicyCore:
    tree: dict = {"checkpoint_dir": str(workdir / f"inproc-ckpt-{world_size}"), "torch_threads": threads,
                  "world_size": world_size}
    for dotted, value in OVERRIDES.items():
        node = tree
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return PolicyCore(PolicyConfig.model_validate(tree))


def digit_share(text: str) -> float:
    return sum(ch.isdigit() for ch in text) / max(1, len(text))


def compare_world_sizes(args: argparse.Namespace) -> None:
    """Train step time of 1 rank beside `args.world_size` ranks, in-process, on the same rollout."""
    prompts = [p.question for p in make_split(args.prompts, 0, "bench")]
    with tempfile.TemporaryDirectory() as tmp:
        single = in_process_core(Path(tmp), args.threads)
        sharded = in_process_core(Path(tmp), args.threads, args.world_size)
        try:
            groups, _ = single.generate(prompts, SamplingParams(n=args.n, temperature=1.0,
                                                                max_new_tokens=args.max_new_tokens, seed=99))
            rollout = [c for group in groups for c in group]
            samples = [RolloutSample(c.prompt_token_ids, c.token_ids) for c in rollout]
            rewards = [digit_share(c.text) for c in rollout]

            def step(core: PolicyCore, index: int) -> float:
                start = time.perf_counter()
                core.train(f"bench/{index}", samples, rewards, args.n)
                return time.perf_counter() - start

            step(single, -1)  # warm-up, both sides
            step(sharded, -1)
            single_s, sharded_s = [], []
            for r in range(args.rounds):
                sides = [(single, single_s), (sharded, sharded_s)]
                for core, out in sides if r % 2 == 0 else sides[::-1]:
                    out.append(step(core, r))
        finally:
            sharded.close()
    one, many = statistics.median(single_s), statistics.median(sharded_s)
    result = {
        "bench": "policy-world-size",
        "model": "tiny",
        "device": "cpu",
        "backend": "gloo",
        "world_size": args.world_size,
        "sequences": len(samples),
        "completion_tokens": sum(len(s.completion_token_ids) for s in samples),
        "micro_batch_size": OVERRIDES["optim.micro_batch_size"],
        "rounds": args.rounds,
        "torch_threads_per_rank": args.threads,
        "train_step_s_1_rank": round(one, 4),
        f"train_step_s_{args.world_size}_ranks": round(many, 4),
        "ratio": round(many / one, 3),
    }
    print(f"train: {one * 1000:.0f} ms/step on 1 rank, {many * 1000:.0f} ms/step on {args.world_size} ranks "
          f"(FSDP2, gloo, CPU; medians of {args.rounds}). On a CPU with a tiny model the collectives outweigh the "
          "split compute; the figure that matters is on GPUs.")
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on each side (each rank)")
    parser.add_argument("--world-size", type=int, default=1,
                        help="above 1: compare the train step of 1 rank and of this many ranks instead")
    args = parser.parse_args()
    if args.world_size > 1:
        compare_world_sizes(args)
        return

    prompts = [(p.id, p.question) for p in make_split(args.prompts, 0, "bench")]
    texts = [text for _, text in prompts]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        proc, address = start_service(workdir, args.threads)
        core = in_process_core(workdir, args.threads)
        client = PolicyClient(address)
        client.wait_ready(60)
        try:
            def generate_local(seed: int) -> tuple[float, int]:
                start = time.perf_counter()
                groups, _ = core.generate(texts, SamplingParams(n=args.n, temperature=1.0,
                                                                max_new_tokens=args.max_new_tokens, seed=seed))
                return time.perf_counter() - start, sum(len(c.token_ids) for g in groups for c in g)

            def generate_remote(seed: int) -> tuple[float, int]:
                start = time.perf_counter()
                reply = client.generate(prompts, n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens,
                                        seed=seed)
                return time.perf_counter() - start, sum(len(c.token_ids) for c in reply.completions)

            generate_local(10_000)  # warm-up, both sides
            generate_remote(10_000)
            local_tps, remote_tps = [], []
            for r in range(args.rounds):
                sides = [(generate_local, local_tps), (generate_remote, remote_tps)]
                for fn, out in sides if r % 2 == 0 else sides[::-1]:
                    seconds, tokens = fn(r)
                    out.append(tokens / seconds)

            # One rollout, from the service (as the orchestrator would get it), trained on by both sides.
            reply = client.generate(prompts, n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=99)
            rollout = list(reply.completions)
            samples = [RolloutSample(list(c.prompt_token_ids), list(c.token_ids)) for c in rollout]
            rewards = [digit_share(c.text) for c in rollout]

            def train_local(step: int) -> float:
                start = time.perf_counter()
                core.train(f"bench/{step}", samples, rewards, args.n)
                return time.perf_counter() - start

            # The same rollout is trained on at every version, for its timing only: both sides take it as sampled by
            # the trainer's current version (the core's default), so neither weights its tokens nor refuses it.
            remote_version = [reply.version]

            def train_remote(step: int) -> float:
                start = time.perf_counter()
                result = client.train("bench", step, rollout, rewards, args.n, remote_version[0])
                remote_version[0] = result.version
                return time.perf_counter() - start

            train_local(-1)  # warm-up
            train_remote(-1)
            local_s, remote_s = [], []
            for r in range(args.rounds):
                sides = [(train_local, local_s), (train_remote, remote_s)]
                for fn, out in sides if r % 2 == 0 else sides[::-1]:
                    out.append(fn(r))
        finally:
            client.close()
            proc.terminate()
            proc.wait(30)

    gen_local, gen_remote = statistics.median(local_tps), statistics.median(remote_tps)
    step_local, step_remote = statistics.median(local_s), statistics.median(remote_s)
    result = {
        "bench": "policy",
        "model": "tiny",
        "prompts": args.prompts,
        "n": args.n,
        "max_new_tokens": args.max_new_tokens,
        "rounds": args.rounds,
        "torch_threads": args.threads,
        "generate_tokens_per_s_in_process": round(gen_local, 1),
        "generate_tokens_per_s_grpc": round(gen_remote, 1),
        "generate_ratio": round(gen_remote / gen_local, 3),
        "train_step_s_in_process": round(step_local, 4),
        "train_step_s_grpc": round(step_remote, 4),
        "train_ratio": round(step_local / step_remote, 3),
    }
    print(f"generate: {gen_local:.0f} tok/s in-process, {gen_remote:.0f} tok/s over gRPC "
          f"(ratio {result['generate_ratio']:.3f}; medians of {args.rounds})")
    print(f"train:    {step_local * 1000:.0f} ms/step in-process, {step_remote * 1000:.0f} ms/step over gRPC "
          f"(ratio {result['train_ratio']:.3f})")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
