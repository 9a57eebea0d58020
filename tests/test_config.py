import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cooper.config import ConfigError, CooperConfig, cli_overrides, env_overrides, load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def test_defaults_are_the_papers():
    c = CooperConfig()
    assert c.policy.grpo.clip_low == 0.2 and c.policy.grpo.clip_high == 0.2 and c.policy.grpo.dual_clip == 3.0
    assert c.policy.grpo.kl_coef == 0.001 and c.policy.optim.lr == 1e-6 and c.policy.optim.warmup_steps == 20
    assert c.reward.optim.lr == 1e-5 and c.reward.optim.weight_decay == 0.01 and c.reward.optim.grad_clip == 1.0
    assert c.generator.attempts == 3 and c.generator.temperature == 0.7
    assert c.eval.k == 8 and c.eval.temperature == 0.7 and c.eval.top_p == 0.95


def test_precedence_yaml_env_cli(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("run:\n  steps: 3\n  seed: 7\nreward:\n  http:\n    port: 8100\n")
    env = {"COOPER_RUN__STEPS": "4", "COOPER_REWARD__HTTP__TOKEN": "s3cret", "UNRELATED": "x"}
    c = load_config(path, ["run.steps=5", 'policy.sampling.stop=["\\n\\n"]'], environ=env)
    assert c.run.steps == 5  # cli beats env beats yaml
    assert c.run.seed == 7
    assert c.reward.http.port == 8100
    assert c.reward.http.token is not None and c.reward.http.token.get_secret_value() == "s3cret"
    assert c.policy.sampling.stop == ["\n\n"]


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["reward.servr.port=1"], "unknown config key 'reward.servr'"),
        (["run.steps=zero"], "config key 'run.steps'"),
        (["policy.sampling.n=1"], "config key 'policy.sampling.n'"),
        (["verifier.timeout_s=0.5"], "config key 'verifier.timeout_s'"),
        (["run.steps"], "not of the form"),
        (["run.steps.x=1"], "config key 'run.steps'"),
        (["run.steps=3", "run.steps.x=1"], "'run.steps' is a value"),
    ],
)
def test_bad_config_names_the_key(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides, environ={})
    assert needle in str(err.value)


def test_bad_env_key_is_named():
    with pytest.raises(ConfigError, match="unknown config key 'verifier.wrkers'"):
        load_config(None, [], environ={"COOPER_VERIFIER__WRKERS": "2"})


def test_parsers_build_nested_trees():
    assert cli_overrides(["a.b.c=1", "a.d=x"]) == {"a": {"b": {"c": 1}, "d": "x"}}
    assert env_overrides({"COOPER_A__B": "true", "COOPER_PLAIN": "1"}) == {"a": {"b": True}}


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml", environ={})


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_checked_in_config_loads(path):
    load_config(path, environ={})


def test_config_module_imports_without_torch():
    code = "import sys, cooper.config, cooper.cli; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_cli_rejects_a_bad_key_fast():
    env = {k: v for k, v in os.environ.items() if not k.startswith("COOPER_")}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "cooper.cli", "serve", "verifier", "--check-config", "verifier.wrkers=2"],
        capture_output=True, text=True, env=env, cwd=ROOT,
    )
    elapsed = time.perf_counter() - start
    assert proc.returncode == 2
    assert "unknown config key 'verifier.wrkers'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert elapsed < 3.0  # includes interpreter start-up; the check itself is well under a second


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COOPER_")}
    return subprocess.run([sys.executable, "-m", "cooper.cli", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=60)


def test_the_cli_answers_what_it_is_asked():
    import cooper

    assert cli("--version").stdout.strip() == f"cooper {cooper.__version__}"
    # Plain `cooper config` shows what plain `cooper train` runs (the tiny preset); `none` the built-in defaults.
    shown = cli("config", "--log-level", "WARNING")  # the flag after the command, too
    assert shown.returncode == 0, shown.stderr
    assert CooperConfig.model_validate(yaml.safe_load(shown.stdout)).data.preset == "tiny"
    defaults = CooperConfig.model_validate(yaml.safe_load(cli("config", "--config", "none").stdout))
    assert defaults == CooperConfig()
    # Every command that takes --config takes a preset's name.
    checked = cli("serve", "verifier", "--config", "tiny", "--check-config")
    assert checked.returncode == 0 and "config ok for service verifier" in checked.stderr, checked.stderr
    # Each command's help describes that command.
    assert "binary cross-entropy" in cli("pretrain-rm", "--help").stdout
    assert "widening by 0.25 or more" in cli("experiment", "--help").stdout


def test_overriding_one_key_keeps_the_sections_other_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("verifier:\n  server:\n    host: 0.0.0.0\n")
    c = load_config(path, ["reward.server.port=6000"], environ={})
    assert (c.verifier.server.host, c.verifier.server.port, c.verifier.server.metrics_port) == ("0.0.0.0", 50051, 9101)
    assert (c.reward.server.port, c.reward.server.metrics_port) == (6000, 9102)


def test_vllm_engines_refuse_at_config_time_what_vllm_would_refuse():
    with pytest.raises(ConfigError, match=r"policy.sampling.temperature is 2.5, above the 2.0 that vLLM accepts"):
        load_config(overrides=["policy.engine=vllm", "policy.sampling.temperature=2.5"], environ={})
    with pytest.raises(ConfigError, match="greedy"):
        load_config(overrides=["policy.engine=vllm", "policy.sampling.temperature=0"], environ={})
    with pytest.raises(ConfigError, match="eval.temperature is 3"):
        load_config(overrides=["policy.engine=vllm", "eval.temperature=3"], environ={})
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES=1"):
        load_config(overrides=["policy.engine=vllm", "policy.device=cuda:1"], environ={})
    with pytest.raises(ConfigError, match="generator.temperature is 2.2"):
        load_config(overrides=["generator.assistant.backend=vllm", "generator.temperature=2.2"], environ={})
    # The transformers engine samples at any temperature; vLLM at 2 and below.
    assert load_config(overrides=["policy.sampling.temperature=2.5"], environ={}).policy.sampling.temperature == 2.5
    assert load_config(overrides=["policy.engine=vllm", "policy.sampling.temperature=2"], environ={})


def test_completion_seeds_are_distinct_across_prompts_children_and_requests():
    from cooper.services.policy.vllm_engine import completion_seeds

    # vLLM seeds child j of a prompt with the prompt's seed + j.
    def every_seed(seed, prompts, n):
        return [base + j for base in completion_seeds(seed, prompts, n) for j in range(n)]

    one = every_seed(3, 64, 16)
    assert len(set(one)) == 64 * 16
    assert not set(one) & set(every_seed(4, 64, 16))
    with pytest.raises(ValueError, match="fewer prompts"):
        completion_seeds(0, 1 << 20, 32)


def test_rollouts_ahead_get_their_importance_cap_and_the_checkpoints_to_resume_exactly():
    ahead = load_config(None, ["run.max_staleness=1"], environ={})
    assert ahead.policy.grpo.rollout_is_cap == 2.0 and load_config(None, [], environ={}).policy.grpo.rollout_is_cap is None
    assert load_config(None, ["run.max_staleness=1", "policy.grpo.rollout_is_cap=5"], environ={}).policy.grpo \
        .rollout_is_cap == 5.0
    for bad, needle in ((["policy.save_every=1"], "policy.save_every >= 2"),
                        (["policy.keep_checkpoints=1"], "keep_checkpoints >= 2"),
                        (["alarm.mode=act", "alarm.actions=[rollback]"], "rollback needs run.max_staleness=0")):
        with pytest.raises(ConfigError, match=needle):
            load_config(None, ["run.max_staleness=2", *bad], environ={})
    assert load_config(None, ["run.max_staleness=2", "policy.journal=false", "policy.save_every=0"], environ={})


def help_examples() -> list[str]:
    """Every `cooper ...` line under "Examples:" in the help of `cooper` and of each subcommand."""
    from cooper.cli import _parser

    parser = _parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices.values()
    helps = [parser.format_help(), *(command.format_help() for command in commands)]
    examples = []
    for text in helps:
        block = text.split("Examples:\n", 1)[1] if "Examples:\n" in text else ""
        for line in block.replace("\\\n", " ").splitlines():  # a trailing backslash continues the example
            if not line.startswith("  cooper "):
                break
            examples.append(" ".join(line.split("#", 1)[0].split()))
    return sorted(set(examples))


def test_every_help_example_parses_and_its_config_loads():
    from cooper.cli import parse_args
    from cooper.config import preset_path

    examples = help_examples()
    assert len(examples) >= 15 and "cooper train" in examples  # every subcommand's block was found
    for example in examples:
        args = parse_args(shlex.split(example)[1:])  # exits 2 on an unknown flag or argument
        if getattr(args, "config", None) is not None or args.overrides:
            assert load_config(ROOT / preset_path(args.config or "tiny"), args.overrides, environ={}), example
