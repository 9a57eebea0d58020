"""`cooper experiment`'s comparison outputs, on records shaped like real runs' metrics."""

import subprocess
import sys
import time
from pathlib import Path

from cooper.experiments.experiment import accuracy_points, compare_plot, compare_table, run_order


def _records(mode: str, rewards: list[float]) -> list[dict]:
    out = []
    for step, reward in enumerate(rewards):
        record = {"step": step, "mode": mode, "reward_mean": reward, "verifier_accuracy": 0.3}
        if mode != "rule":
            record["rm_verifier_disagreement"] = reward - 0.3
        if step == len(rewards) - 1:
            record["test/gsm8k"] = 0.5
        out.append(record)
    return out


def test_compare_table_and_plot(tmp_path):
    runs = {"rule": _records("rule", [0.3, 0.3]), "static": _records("static", [0.5, 0.9]),
            "cooper": _records("cooper", [0.5, 0.6])}
    table = compare_table(runs).splitlines()
    assert table[0].split() == ["mode", "reward_mean", "verifier_accuracy", "rm_verifier_disagreement", "rm_auroc",
                                "kl_from_initial", "test/gsm8k"]
    assert table[1].split() == ["rule", "0.300", "0.300", "-", "-", "-", "0.500"]
    assert table[2].split() == ["static", "0.900", "0.300", "0.600", "-", "-", "0.500"]  # the last step's values
    path = compare_plot(runs, tmp_path / "compare.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000


def test_experiment_rejects_unknown_modes():
    result = subprocess.run([sys.executable, "-m", "cooper.cli", "experiment", "--modes", "rule,greedy"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "--modes takes rule, static, cooper, cooper-rollouts, cooper-paper" in result.stderr


def test_test_accuracy_starts_at_the_initial_policy_and_seeds_average(tmp_path):
    seed0 = _records("static", [0.5, 0.9])
    seed0[0]["test_initial/gsm8k"] = 0.4
    seed1 = _records("static", [0.7, 0.7])
    seed1[0]["test_initial/gsm8k"] = 0.2
    seed1[-1]["test/gsm8k"] = 0.1
    assert accuracy_points(seed0, "gsm8k") == [(0, 0.4), (2, 0.5)]  # before any update, then after step 1 (2 updates)
    table = compare_table({"static": [seed0, seed1]}).splitlines()
    assert table[1].split() == ["static", "0.800", "0.300", "0.500", "-", "-", "0.300"]  # means of the last values
    path = compare_plot({"static": [seed0, seed1], "rule": [_records("rule", [0.3, 0.4])]}, tmp_path / "c.png")
    assert path.stat().st_size > 20_000


def test_the_longest_runs_start_first_in_seed_order():
    order = run_order(["rule", "static", "cooper", "cooper-paper", "static-noaction"], [5, 3])
    assert order == [("cooper", 5), ("cooper-paper", 5), ("cooper", 3), ("cooper-paper", 3),
                     ("static", 5), ("static-noaction", 5), ("static", 3), ("static-noaction", 3),
                     ("rule", 5), ("rule", 3)]


def test_experiment_rejects_bad_seeds():
    result = subprocess.run([sys.executable, "-m", "cooper.cli", "experiment", "--seeds", "0,x"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "seeds are integers" in result.stderr


def test_overoptimization_and_health_plots(tmp_path):
    from cooper.experiments.best_of_n import BestOfN
    from cooper.experiments.figures import mean_over_seeds, overoptimization_plot, rm_health_plot, smooth

    seeds = []
    for offset in (0.0, 0.1):
        records = _records("static", [0.4 + 0.01 * t for t in range(12)])
        for t, r in enumerate(records):
            r.update(kl_from_initial=0.05 * t + offset, rm_auroc=0.9 - 0.02 * t, rm_false_positive_rate=0.1 + 0.03 * t)
        seeds.append(records)
    assert mean_over_seeds(seeds, "kl_from_initial")[2] == (2, 0.15000000000000002)
    assert smooth([1.0, 3.0, 5.0], 2) == [1.0, 2.0, 4.0]
    curve = [BestOfN(1, 0.0, 0.3, 0.5), BestOfN(8, 1.2, 0.4, 0.8)]
    for path in (overoptimization_plot({"static": seeds}, tmp_path / "o.png", curve),
                 rm_health_plot({"static": seeds}, tmp_path / "h.png")):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000


def test_a_run_dies_with_a_killed_experiment(tmp_path):
    # SIGKILL (or SIGTERM) skips the experiment's own clean-up; its runs must not train on, orphaned.
    parent = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from cooper.experiments.experiment import start_child\n"
        f"child = start_child(['sleep', '120'], Path({str(tmp_path / 'run.log')!r}))\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    child_pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child_pid}").exists() and time.monotonic() < deadline:
        state = Path(f"/proc/{child_pid}/stat").read_text().split()[2] if Path(f"/proc/{child_pid}").exists() else ""
        if state == "Z":  # dead, waiting for its new parent to reap it
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{child_pid}").exists() or state == "Z"


def test_results_name_the_initial_models_and_the_cpu_kernels():
    import hashlib

    from cooper.config import load_config
    from cooper.experiments.experiment import provenance
    from cooper.runtime.models import resolve_model

    config = load_config(None, ["policy.model=tiny", "reward.model=tiny"])
    found = provenance(config)
    weights = Path(resolve_model("tiny", "causal")) / "model.safetensors"
    assert found["policy_weights"] == hashlib.sha256(weights.read_bytes()).hexdigest()[:16]
    assert found["reward_weights"] not in ("", found["policy_weights"])  # another model, another digest
    assert found["cpu_capability"] in ("DEFAULT", "AVX2", "AVX512", "ZVECTOR", "VSX", "SVE256", "SVE")
    hub = provenance(load_config(None, ["policy.model=Qwen/Qwen2.5-0.5B", "reward.model=tiny"]))
    assert hub["policy_weights"] == ""  # named by its hub revision, nothing local to hash
