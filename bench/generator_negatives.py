"""Valid-negative rate and time of each negative strategy on the example solutions, through a real verifier.

    python bench/generator_negatives.py [--repeats 3] [--llm-extra-tokens 16] [--solutions 64]

Starts `cooper serve verifier` on loopback, then runs `make_negatives` over the 64 example solutions
(cooper/tiny/examples.py: `\\boxed{}`, `####`, "The answer is") with
- perturb (the baseline: rule-based, no model), and
- llm with the tiny local transformers model (random weights: its text is nonsense, so its rate measures the
  filter, not a rewriter; with a real assistant this is the number to watch).
Reports, per strategy, the valid rate, the mean attempts, the rejection reasons and the median wall time of a
full pass, with the llm/perturb time ratio. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from cooper.config import AssistantConfig, ServerConfig
from cooper.services.generator.assistant import TransformersAssistant
from cooper.services.generator.negatives import LLMStrategy, RuleStrategy, Strategy, make_negatives, valid_rate
from cooper.services.generator.server import RemoteVerifier
from cooper.services.verifier.client import VerifierClient
from cooper.tiny.examples import example_tasks


def start_verifier(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    ready = workdir / "verifier.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cooper.cli", "--log-level", "WARNING", "serve", "verifier", "--port", "0",
         "verifier.server.metrics_port=null", "--ready-file", str(ready)],
    )
    end = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > end:
            proc.kill()
            raise SystemExit("bench: the verifier did not start")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{json.loads(ready.read_text())['grpc_port']}"


def run(strategy: Strategy, verify: RemoteVerifier, repeats: int, solutions: int) -> dict:
    tasks = example_tasks()[:solutions]
    times, rates, attempts, reasons = [], [], [], Counter()
    for _ in range(repeats):
        start = time.perf_counter()
        outcomes = asyncio.run(make_negatives(tasks, strategy, verify, attempts=3))
        times.append(time.perf_counter() - start)
        rates.append(valid_rate(outcomes))
        attempts.append(statistics.mean(o.attempts for o in outcomes))
        reasons.update(r.split(":")[0] for o in outcomes for r in o.rejections)
    return {
        "solutions": len(tasks),
        "valid_rate": round(statistics.median(rates), 4),
        "mean_attempts": round(statistics.median(attempts), 3),
        "median_s": round(statistics.median(times), 3),
        "rejections": dict(reasons.most_common()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--llm-extra-tokens", type=int, default=16,
                        help="extra tokens over the positive's word count (500 in real runs; small keeps CPU time low)")
    parser.add_argument("--solutions", type=int, default=64,
                        help="the first N of the 64 example solutions (fewer: a quick check that the script runs)")
    args = parser.parse_args()
    if args.solutions < 1:
        parser.error("--solutions must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        proc, address = start_verifier(Path(tmp))
        try:
            client = VerifierClient(address, ServerConfig(deadline_s=120))
            client.wait_ready(30)
            verify = RemoteVerifier(client)
            results = {"perturb": run(RuleStrategy(), verify, args.repeats, args.solutions)}
            assistant = TransformersAssistant(AssistantConfig(model="tiny", device="cpu", concurrency=16))
            results["llm_tiny"] = run(LLMStrategy(assistant, 0.7, args.llm_extra_tokens), verify, args.repeats,
                                      args.solutions)
            client.close()
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    for name, r in results.items():
        print(f"{name:9s} valid {r['valid_rate']:.3f}  attempts {r['mean_attempts']:.2f}  "
              f"median {r['median_s']:.2f} s  rejections {r['rejections']}")
    ratio = results["llm_tiny"]["median_s"] / max(results["perturb"]["median_s"], 1e-9)
    print(json.dumps({"bench": "generator_negatives", "repeats": args.repeats, **results,
                      "time_ratio_llm_tiny_over_perturb": round(ratio, 2)}))


if __name__ == "__main__":
    main()
