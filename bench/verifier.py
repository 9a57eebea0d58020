"""Verifier throughput: math-verify called in a loop in one process vs the service over gRPC (1 and 2 workers).

The same ~500 realistic cases go through each path: the test table plus arithmetic solutions in the three usual
endings, checked in groups of four completions per reference as GRPO does. Each path runs `--repeats` times and
reports its median. The last line printed is one JSON object:
{"cases": N, "direct_per_s": x, "service_1w_per_s": y, "service_2w_per_s": z, "ratio_1w": y/x, "ratio_2w": z/x}
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from math_verify import parse, verify

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from verifier_cases import CASES  # noqa: E402

from cooper.runtime.processes import start_service  # noqa: E402
from cooper.services.verifier.client import VerifierClient  # noqa: E402
from cooper.services.verifier.rules import looks_bare  # noqa: E402
from cooper.tiny.task import make_split, wrong_solution  # noqa: E402


def build_cases(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    cases = [(c, r) for _, c, r, _ in CASES]
    endings = [lambda s, a: s, lambda s, a: s.rsplit("The answer", 1)[0] + f"\n#### {a}",
               lambda s, a: s.rsplit("The answer", 1)[0] + f"The answer is {a}."]
    for problem in make_split(n, seed, "bench"):
        reference = problem.answer if rng.random() < 0.5 else problem.solution
        for _ in range(4):
            if rng.random() < 0.5:
                text, answer = problem.solution, problem.answer
            else:
                text = wrong_solution(problem, rng)
                answer = text.rsplit("{", 1)[1].split("}")[0]
            cases.append((rng.choice(endings)(text, answer), reference))
            if len(cases) >= n:
                return cases
    return cases


def direct_verdicts(cases: list[tuple[str, str]]) -> list[bool]:
    out = []
    for completion, reference in cases:
        ref = reference.strip()
        gold = (parse(f"${ref}$") if looks_bare(ref) else []) or parse(ref)
        out.append(bool(gold) and verify(gold, parse(completion)))
    return out


def timed(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def service_rate(cases: list[tuple[str, str]], workers: int, repeats: int) -> float:
    service = start_service("verifier", overrides=[f"verifier.workers={workers}", "verifier.server.metrics_port=null"])
    try:
        with VerifierClient(service.address) as client:
            client.wait_ready(60)
            client.verify_pairs(cases[:50])  # warm the connection and the workers' reference caches alike
            return len(cases) / timed(lambda: client.verify_pairs(cases), repeats)
    finally:
        service.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=500, help="number of cases (default 500)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per path; the median is reported (default 3)")
    args = parser.parse_args()
    cases = build_cases(args.cases)
    direct_verdicts(cases[:50])  # warm math-verify's lazy parsers, as the workers do
    direct = len(cases) / timed(lambda: direct_verdicts(cases), args.repeats)
    print(f"direct: {direct:.1f} checks/s", file=sys.stderr)
    one = service_rate(cases, 1, args.repeats)
    print(f"service, 1 worker: {one:.1f} checks/s", file=sys.stderr)
    two = service_rate(cases, 2, args.repeats)
    print(f"service, 2 workers: {two:.1f} checks/s", file=sys.stderr)
    print(json.dumps({
        "cases": len(cases), "direct_per_s": round(direct, 1), "service_1w_per_s": round(one, 1),
        "service_2w_per_s": round(two, 1), "ratio_1w": round(one / direct, 3), "ratio_2w": round(two / direct, 3),
    }))


if __name__ == "__main__":
    main()
