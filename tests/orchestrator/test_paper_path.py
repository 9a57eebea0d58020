"""README's path at the paper's scale, rehearsed end to end on a CPU: `cooper annotate`, `cooper pretrain-rm`,
`cooper data`, `cooper eval-rm` and `cooper train --config qwen2.5-1.5b-cooper` (then `--resume` after a kill),
each run as README (and docs/training.md, for the test sets) writes it, as a subprocess.

Only what cannot run here is swapped (docs/training.md, "What a CPU rehearsal of the path leaves out"): the three
models are tiny head_dim-32 Qwen2 stand-ins (paper_path.py), the judge's endpoint is a rule behind the OpenAI API,
the sizes that decide the time (steps, batch, G, max tokens, the test sets' size, the checkpoint and evaluation
cadence with them) are dotted overrides, vLLM's memory share is set for a CPU, and the policy trains on two ranks
(FSDP2 over gloo) where the preset has one. Everything else is the preset's.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from paper_path import commands_under, fit_rewriter, judge_endpoint, sample_triples, swapped, write_sources

from cooper.boxed import last_boxed
from cooper.config import load_config, preset_path
from cooper.orchestrator.outputs import read_metrics
from cooper.runtime.models import resolve_model
from cooper.tiny.task import make_split

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PRESET = "qwen2.5-1.5b-cooper"

SIZES = ["run.steps=4", "run.batch_size=4", "policy.sampling.n=4", "policy.sampling.max_new_tokens=48",
         "run.checkpoint_every=2", "eval.every=2"]
"""What decides the time, shrunk (docs/training.md lists each with the preset's value)."""
RANKS = ["policy.world_size=2"]
"""The preset trains the policy in one process; two ranks (FSDP2 over gloo on a CPU) rehearse the sharded update
beside the vLLM engine, the kill and the resume, as several GPUs would run them."""
ON_A_CPU = ["policy.vllm_gpu_memory_utilization=0.1", "generator.assistant.gpu_memory_utilization=0.1"]
"""vLLM's CPU build reads the memory share as a share of the machine's memory: the preset's 0.3 and 0.9 would take
most of it."""


def cooper(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    assert argv[0] == "cooper"
    result = subprocess.run([sys.executable, "-m", "cooper.cli", *argv[1:]], cwd=cwd, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{' '.join(argv)}\n{result.stderr[-4000:]}"
    return result


def last_json(result: subprocess.CompletedProcess) -> dict:
    return json.loads(result.stdout.strip().splitlines()[-1])


def services_of(pid: int, name: str) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            line = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "serve" in line and name in line:
            found.append(child)
    return found


@pytest.mark.timeout(900)
def test_the_paper_path_runs_as_readme_writes_it(tmp_path):
    started = time.monotonic()
    readme = (ROOT / "README.md").read_text()
    annotate, pretrain, data_train, eval_rm, train = commands_under(readme, "## On GPUs, at the paper's scale")
    assert [c[1] for c in (annotate, pretrain, data_train, eval_rm, train)] == [
        "annotate", "pretrain-rm", "data", "eval-rm", "train"]
    preset = load_config(preset_path(PRESET))
    data_tests = [c for c in commands_under((ROOT / "docs" / "training.md").read_text(), "### Data and evaluation")
                  if c[1] == "data" and c[c.index("-o") + 1] in preset.data.test_paths.values()]
    assert sorted(c[c.index("-o") + 1] for c in data_tests) == sorted(preset.data.test_paths.values())

    policy = resolve_model("tiny-sft-hd32", "causal")
    problems = make_split(16, 0, "paper-train")
    tests = make_split(2, 0, "paper-test")
    write_sources(tmp_path, problems, tests)
    assistant = fit_rewriter(resolve_model("tiny-hd32", "causal"), tmp_path / "stand-in-assistant", problems[:3])

    # 1. annotate the stand-in policy's own triples, the judge wrong on one of them
    triples = sample_triples(policy, make_split(8, 1, "paper-triples"), samples=2, max_new_tokens=48, seed=0)
    (tmp_path / "triples.jsonl").write_text("".join(json.dumps(t) + "\n" for t in triples))
    right = [t for t in triples if last_boxed(t["completion"]) == t["reference"]]
    wrong = [t for t in triples if last_boxed(t["completion"]) not in (None, t["reference"])]
    assert right and len(wrong) >= 2, "the stand-in policy wrote no right or too few wrong answers to label"
    misjudged = wrong[0]["completion"]
    with judge_endpoint(frozenset({misjudged})) as (base_url, received):
        result = cooper(swapped(annotate, {"generator.assistant.base_url": base_url}, ["--no-progress"]), tmp_path)
    stats = last_json(result)
    assert received and {r["model"] for r in received} == {"Qwen2.5-7B-Instruct"}
    assert stats["total"] == len(triples) and stats["judge_labelled"] == len(triples)
    assert stats["verifier_labelled"] >= len(right) + len(wrong) - 1
    assert stats["disagreed"] >= 1 and stats["kept_correct"] >= 1 and stats["kept_incorrect"] >= 1
    labelled = [json.loads(line) for line in (tmp_path / "labelled.jsonl").read_text().splitlines()]
    assert len(labelled) == stats["agreed"]
    assert misjudged not in {row["completion"] for row in labelled}  # the disagreement was dropped
    for row in labelled:
        assert row["label"] == (row["verifier"] == "CORRECT") == (row["judge"] == "YES")
        assert row["label"] == (last_boxed(row["completion"]) == row["reference"])

    # 2. pretrain VerifyRM on what they agreed on, from the stand-in base
    report = last_json(cooper(swapped(pretrain, {"reward.model": resolve_model("tiny-hd32", "reward")}), tmp_path))
    assert report["train"] + report["heldout"] == len(labelled) and report["output"] == "models/verify-rm"
    assert (tmp_path / "models" / "verify-rm" / "config.json").exists()
    assert 0 < report["positives"] < len(labelled)

    # 3. the datasets, from their published formats to the files the preset names
    for command in [data_train, *data_tests]:
        cooper(command, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / preset.data.train_path).read_text().splitlines()]
    assert [(r["question"], r["answer"]) for r in rows] == [(p.question, p.answer) for p in problems]
    for name, path in preset.data.test_paths.items():
        rows = [json.loads(line) for line in (tmp_path / path).read_text().splitlines()]
        assert [r["answer"] for r in rows] == [p.answer for p in tests], name
    parquet = cooper_parquet(tmp_path)
    if parquet is not None:
        assert parquet == (tmp_path / preset.data.test_paths["gsm8k"]).read_text()

    # 4. VerifyBench's format, judged by the pretrained VerifyRM and the verifier
    bench = [{"question": t["question"], "answer": t["reference"], "completion": t["completion"],
              "gold_correct": last_boxed(t["completion"]) == t["reference"], "answer_type": "numeric"}
             for t in triples]
    (tmp_path / "verifybench.jsonl").write_text("".join(json.dumps(b) + "\n" for b in bench))
    cooper(eval_rm, tmp_path)
    scored = json.loads((tmp_path / "verifyrm.json").read_text())
    assert scored["n"] == len(bench) and scored["gold_correct"] == sum(b["gold_correct"] for b in bench)
    assert scored["reward_model"] == "models/verify-rm"
    # A random tiny base, pretrained at the paper's lr (2e-5) for 3 epochs on a dozen triples, stays at chance:
    # the rehearsal checks that the model it wrote loads and scores, not that it learnt (the tiny preset's does).
    assert 0 <= scored["verifyrm"]["accuracy"] <= 1 and scored["verifyrm"]["auroc"] is not None
    assert scored["verifier"]["accuracy"] == 1.0

    # 5. train; the policy service and the orchestrator killed after two steps; --resume finishes the run
    argv = swapped(train, {}, ["--no-progress", f"policy.model={policy}", f"generator.assistant.model={assistant}",
                               "run.name=paper", *SIZES, *RANKS, *ON_A_CPU])
    run_dir = tmp_path / "runs" / "paper"
    proc = subprocess.Popen([sys.executable, "-m", "cooper.cli", *argv[1:]], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 400
        while len(read_metrics(run_dir)) < 2:
            assert proc.poll() is None, proc.stderr.read().decode()[-4000:]
            assert time.monotonic() < deadline, "the run did not log two steps in time"
            time.sleep(0.5)
        (policy_service,) = services_of(proc.pid, "policy")
        policy_service.send_signal(signal.SIGKILL)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    killed_at = len(read_metrics(run_dir))
    assert killed_at < 4
    deadline = time.monotonic() + 60  # the services learn that their parent died, and exit
    while any(str(run_dir) in " ".join(p.info["cmdline"] or []) and "redis" not in " ".join(p.info["cmdline"] or [])
              for p in psutil.process_iter(["cmdline"])) and time.monotonic() < deadline:
        time.sleep(0.5)
    resumed = cooper(["cooper", "train", "--no-progress", "--resume", "paper"], tmp_path, timeout=400)
    assert "run directory" in resumed.stdout

    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert [r["policy_version"] for r in records] == [1, 2, 3, 4]  # each update once, across the kill
    assert [r["reward_version"] for r in records] == [1, 2, 3, 4]  # cooper mode: VerifyRM updated every step
    assert sum(r["pairs"] for r in records) > 0  # the assistant's rewrites, kept by the verifier, made pairs
    evaluated = [r["step"] for r in records if all(f"test/{name}" in r for name in preset.data.test_paths)]
    assert evaluated == [1, 3]  # every test set of the preset, every eval.every steps
    assert json.loads((run_dir / "checkpoint.json").read_text())["step"] == 3
    assert any((run_dir / "checkpoints" / "policy").iterdir()) and any((run_dir / "checkpoints" / "reward").iterdir())
    logs = run_dir / "logs"
    policy_log = (logs / "policy.log").read_text()
    assert "Initializing a V1 LLM engine" in policy_log  # vLLM rollouts
    assert policy_log.count("2 ranks ready on 1 node(s) (FSDP2, gloo)") == 2  # started, then resumed
    assert "Initializing a V1 LLM engine" in (logs / "generator.log").read_text()  # the vLLM assistant

    # Every setting but the stand-ins, the sizes and the memory share is the preset's.
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    expected = yaml.safe_load(yaml.safe_dump(load_config(preset_path(PRESET), [
        "reward.model=models/verify-rm", f"policy.model={policy}", f"generator.assistant.model={assistant}",
        "run.name=paper", *SIZES, *RANKS, *ON_A_CPU]).model_dump(mode="json")))
    assert_same_settings(saved, expected)
    assert saved["eval"]["k"] == 8 and saved["eval"]["top_p"] == 0.95 and saved["policy"]["engine"] == "vllm"
    assert saved["generator"]["strategy"] == "llm" and saved["generator"]["assistant"]["backend"] == "vllm"
    print(f"paper path rehearsed in {time.monotonic() - started:.0f} s (killed after {killed_at} steps)")


def cooper_parquet(root: Path) -> str | None:
    """GSM8K as its publisher ships it (parquet), converted: the JSON Lines written, or None where pyarrow is not
    installed (Cooper does not require it), after checking that the conversion then fails saying so."""
    source = root / "gsm8k" / "test.parquet"
    out = root / "parquet" / "gsm8k_test.jsonl"
    if importlib.util.find_spec("pyarrow") is None:
        source.write_bytes(b"PAR1")
        result = subprocess.run([sys.executable, "-m", "cooper.cli", "data", str(source), "-o", str(out)], cwd=root,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and "needs pyarrow" in result.stderr, result.stderr
        return None
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (root / "gsm8k" / "test.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), source)
    cooper(["cooper", "data", "gsm8k/test.parquet", "-o", str(out)], root)
    return out.read_text()


def assert_same_settings(saved: dict, expected: dict, where: str = "") -> None:
    """The run's saved config is the preset's with the rehearsal's overrides, key for key (secrets are masked in
    the saved one; checkpoint directories and the services' loopback ports are the run's own)."""
    for key, value in expected.items():
        if isinstance(value, dict):
            assert_same_settings(saved[key], value, f"{where}{key}.")
        elif not key.endswith(("_dir", "port", "api_key", "token", "password")):
            assert saved[key] == value, f"{where}{key}: {saved[key]!r} != the preset's {value!r}"
