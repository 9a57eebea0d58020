"""Every bench script runs, on its smallest settings, and ends with its one JSON line (docs/development.md,
"Benchmarks").

Each runs as a user runs it, `python bench/NAME.py ARGS`, on the tiny models; the figures are not checked (on
these settings they mean nothing), only that the script gets to the end and reports the keys it documents.
bench/chaos.py runs in tests/orchestrator/test_chaos.py, which checks what it reports. Left out: the peers of
bench/reward_http.py and bench/startup.py (environments of their own: bench/peers/setup.sh; startup.py runs here
with --no-trl) and the vLLM scripts where vLLM is not installed (the vllm marker skips them, saying so).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPTS = [
    pytest.param("checkpoint.py", ["--repeats", "1", "--skip-large"], {"bench", "every", "journal", "tiny"},
                 marks=pytest.mark.slow, id="checkpoint"),
    pytest.param("verifier.py", ["--cases", "12", "--repeats", "1"],
                 {"cases", "direct_per_s", "service_1w_per_s", "service_2w_per_s"}, id="verifier"),
    pytest.param("generator_negatives.py", ["--repeats", "1", "--llm-extra-tokens", "2", "--solutions", "3"],
                 {"bench", "perturb", "llm_tiny", "time_ratio_llm_tiny_over_perturb"}, marks=pytest.mark.slow,
                 id="generator_negatives"),
    pytest.param("policy.py", ["--rounds", "1", "--prompts", "2", "--n", "2", "--max-new-tokens", "4"],
                 {"bench", "generate_ratio", "train_step_s_grpc"}, marks=pytest.mark.slow, id="policy"),
    pytest.param("reward_http.py", ["--servers", "service", "--seconds", "0.5", "--rounds", "1", "--clients", "4",
                                    "--items", "128", "--check-items", "8", "--warmup", "4", "--ceiling-seconds", "0.3",
                                    "--sweep-batch", "16", "--sweep-wait-ms", "2", "--sweep-seconds", "0.3",
                                    "--sweep-copies", "1", "--sweep-inflight", "2", "--sweep-tokenize", "model"],
                 {"servers", "best_settings", "ceiling_items_per_s", "ceiling_fraction", "scores_match",
                  "ratio_vs_best_peer_reason", "default_vs_best", "default_settings"}, marks=pytest.mark.slow,
                 id="reward_http"),
    pytest.param("linear_kernel.py", ["--models", "tiny-hd32", "--batch", "4", "--passes", "1", "--rounds", "2"],
                 {"bench", "cpu", "models"}, id="linear_kernel"),
    pytest.param("step.py", ["--steps", "1", "--warmup", "1", "--mode", "rule"],
                 {"bench", "inprocess", "services", "overhead"}, marks=pytest.mark.slow, id="step"),
    pytest.param("experiment.py", ["--smoke", "--seeds", "0", "--parallel", "2"],
                 {"seeds", "benchmark", "runs", "across_seeds", "failed_criteria", "reproduced"}, id="experiment"),
    pytest.param("rm_pretraining.py", ["--problems", "20", "--epochs", "1", "--prompts", "4", "--k", "2"],
                 {"samples", "sample_accuracy", "runs"}, marks=pytest.mark.slow, id="rm_pretraining"),
    pytest.param("under_load.py", ["--hogs", "1", "--repeat", "2", "--", sys.executable, "-c", "print('ran')"],
                 {"command", "hogs", "runs", "passed"}, id="under_load"),
    pytest.param("startup.py", ["--rounds", "1", "--steps", "2", "--modes", "rule", "--eval", "off", "--no-trl"],
                 {"first_step_s", "serving_s", "ratio_to_trl"}, id="startup"),
    pytest.param("rollouts_ahead.py", ["--rounds", "1", "--steps", "1", "--warmup", "1", "--settings",
                                       "rule,cooper-reward-behind"],
                 {"bench", "what", "rule", "cooper-reward-behind"}, marks=pytest.mark.slow, id="rollouts_ahead"),
    pytest.param("mutants.py", ["--only", "batch-target-floor"], {"mutants", "survived"}, id="mutants"),
    pytest.param("rm_pretraining.py", ["--model", "tiny-rm", "--prompts", "4", "--k", "2"],
                 {"samples", "sample_accuracy", "model"}, id="rm_pretraining_model"),
    # The real model's path, its first two stages (sampling the policy's triples, annotating them with the verifier:
    # the model as its own judge took most of this test's 603 s on a 2-core AVX2 EPYC, and the judge's path is tested
    # on the tiny models, tests/generator/test_annotation.py); pretrain-rm, eval-rm and the training runs are the
    # commands other tests run on this model (tests/orchestrator/test_real_model_train.py) and on the paper path
    # (tests/orchestrator/test_paper_path.py).
    pytest.param("real_model.py", ["--smoke", "--stages", "sample,annotate", "--without-judge"],
                 {"model", "seed", "sample", "annotate", "seconds", "two_step_share", "test_triples_split"},
                 marks=pytest.mark.slow, id="real_model"),
    pytest.param("cost_model.py", ["--gpus", "4", "--decode-ms", "9"], {"bench", "estimates", "assumptions", "parts_s",
                                                                      "layouts"}, id="cost_model"),
    pytest.param("trl_finding.py", ["--smoke", "--seeds", "7"], {"bench", "seeds", "steps", "criteria", "runs",
                                                                 "reproduced"}, marks=pytest.mark.slow,
                 id="trl_finding"),
    pytest.param("rollout.py", ["--model", "tiny-hd32", "--prompts", "2", "--n", "2", "--max-new-tokens", "4",
                                "--rounds", "1"], {"bench", "tokens_per_s", "ratio"},
                 marks=[pytest.mark.vllm, pytest.mark.slow], id="rollout"),
    pytest.param("rollout_mismatch.py", ["--steps", "1"], {"bench", "runs", "figure"},
                 marks=[pytest.mark.vllm, pytest.mark.slow], id="rollout_mismatch"),
]


RUN_ELSEWHERE = {"chaos.py": "tests/orchestrator/test_chaos.py",
                 "alarm_replay.py": "tests/evaluation/test_alarm_replay.py"}
"""Scripts another test runs whole: there, on a small scale, is the test of the system they measure."""


def test_every_bench_script_is_tested():
    tested = {p.values[0] for p in SCRIPTS} | RUN_ELSEWHERE.keys()
    assert tested == {p.name for p in (ROOT / "bench").glob("*.py")}
    assert all("bench/" + name in (ROOT / test).read_text() for name, test in RUN_ELSEWHERE.items())


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("script", "args", "keys"), SCRIPTS)
def test_the_script_runs_and_ends_with_its_json_line(script: str, args: list[str], keys: set[str],
                                                     tmp_path: Path) -> None:
    # In tmp_path: what a script writes under the working directory (runs/) or in temp directories.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    last = done.stdout.strip().splitlines()[-1]
    result = json.loads(last)
    assert keys <= result.keys(), f"{script}'s last line lacks {sorted(keys - result.keys())}: {last[:1000]}"


def test_real_model_refuses_a_two_step_share_outside_0_to_1_before_any_work(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "real_model.py"), "--two-step-share", "1.5",
                           "--work", str(tmp_path / "work")], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--two-step-share must be between 0 and 1, got 1.5" in done.stderr
    assert not (tmp_path / "work").exists()


def test_real_model_refuses_a_sample_policy_that_is_neither_a_directory_nor_a_known_model(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "real_model.py"), "--sample-policy",
                           str(tmp_path / "no-checkpoint"), "--work", str(tmp_path / "work")],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no-checkpoint: neither a model directory nor a model Cooper knows" in done.stderr
    assert not (tmp_path / "work").exists()


def test_real_model_samples_from_the_policy_it_is_given(tmp_path: Path) -> None:
    """The sample stage draws from --sample-policy's model, not the preset's: the tiny preset's SFT policy and the
    untrained tiny model write different completions of the same problems with the same seed."""
    spec = importlib.util.spec_from_file_location("real_model", ROOT / "bench" / "real_model.py")
    real_model = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(real_model)  # type: ignore[union-attr]
    from cooper.runtime.models import resolve_model

    completions = {}
    for label, policy in (("preset", None), ("given", resolve_model("tiny", "causal"))):
        out = tmp_path / f"{label}.jsonl"
        real_model.sample_triples("tiny", "train", 3, 7, out, policy=policy)
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(rows) == 3 * 4 and all(row["completion"] is not None for row in rows)  # tiny: 4 samples each
        completions[label] = sorted((row["question"], row["completion"]) for row in rows)
    assert [q for q, _ in completions["preset"]] == [q for q, _ in completions["given"]]
    assert completions["preset"] != completions["given"]


def test_under_load_stops_at_the_first_failure_and_says_so(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "under_load.py"), "--hogs", "1", "--repeat", "3", "--",
                           sys.executable, "-c", "raise SystemExit(3)"], capture_output=True, text=True, timeout=60)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 1 and result["passed"] is False and result["runs"] == [result["runs"][0]]
    assert result["runs"][0]["exit"] == 3


def test_the_reward_http_ceiling_runs_the_bare_model_in_as_many_processes_as_the_service_has_copies(monkeypatch):
    # With two model copies the ceiling is two bare model processes at once, their rates summed: a second process
    # (spawned, loading the same model) runs each measurement beside this one and answers its own rate.
    from cooper.runtime.models import resolve_model

    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # the spawned process imports the script's module as this does
    import reward_http

    model_dir = str(resolve_model("tiny-hd32", "reward"))
    items = [{"question": "1+1?", "reference": "2", "completion": f"It is {n}."} for n in range(16)]
    bare = reward_http.BareModel(model_dir, items, threads=1, device="cpu")
    models = reward_http.BareModels(bare, 2, model_dir, items, threads=1, device="cpu")
    try:
        assert models.processes == 2 and models.others[0][0].pid != os.getpid()
        asked = []
        monkeypatch.setattr(bare, "items_per_s", lambda size, seconds: asked.append((size, seconds)) or 0.0)
        both = models.items_per_s(8, 0.3)  # this process's part counted as 0: the rest is the other's
        assert asked == [(8, 0.3)] and both > 0
    finally:
        models.close()
    assert not models.others[0][0].is_alive()
