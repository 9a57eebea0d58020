"""`cooper`: the command line. It validates the config first and imports heavy code (torch, services) after,
so a bad key fails in well under a second."""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from cooper import __version__
from cooper.config import ConfigError, CooperConfig, load_config, preset_path, to_yaml

# Each service module defines `async def create_service(config) -> cooper.runtime.server.GrpcService`.
SERVICES = {
    "verifier": "cooper.services.verifier.server",
    "reward": "cooper.services.reward.server",
    "policy": "cooper.services.policy.server",
    "generator": "cooper.services.generator.server",
}

EPILOG = """\
Config: a YAML file (--config, presets in configs/), then COOPER_<SECTION>__<KEY> environment variables, then
dotted overrides such as `run.steps=5 reward.http.port=8001`, each winning over the one before.
Examples:
  cooper serve verifier --port 50051
  cooper serve reward --config configs/tiny.yaml reward.http.port=8001
  cooper config --config configs/tiny.yaml run.steps=3
"""


SERVE_EPILOG = """\
Runs one service in this process until SIGTERM or Ctrl-C (then a graceful stop): gRPC on <service>.server.port with
the standard health service, reflection and Prometheus metrics; the reward service also serves its HTTP API on
reward.http.port (docs/reward-api.md), choosing at start-up the serving settings its config leaves unset and logging
why. Without --config it takes the built-in defaults (the tiny models); --config takes a YAML file or a preset's
name.
Examples:
  cooper serve verifier --port 50051
  cooper serve reward --config tiny reward.http.port=8001
  cooper serve reward reward.batching.max_batch_size=16 reward.batching.max_wait_ms=2
"""

TRAIN_EPILOG = """\
With no arguments, `cooper train` runs the tiny preset on this machine: a tiny tokenizer and Qwen2 models (a
warm-started policy and a pretrained VerifyRM, shipped with the package), an embedded Redis and the services it
needs on free loopback ports; it trains, and stops everything. Outputs go to runs/<name>/: metrics.jsonl,
alarms.jsonl, plot.png, tensorboard/, the config, checkpoints/, logs/, redis/ (docs/training.md, "What a run
writes"). A config that names service addresses (<service>.server.address) and a Redis URL (redis.url) starts
nothing and only orchestrates.
Examples:
  cooper train
  cooper train run.mode=static run.steps=10
  cooper train --config configs/qwen2.5-1.5b-cooper.yaml
  cooper train --config smol-rule                     # a real pretrained model (requirements/smollm2.txt)
  cooper train --resume cooper-20261120-120000
  cooper train --in-process run.steps=3               # one process: the services' cores called directly
"""


def _preset_config(args: argparse.Namespace) -> CooperConfig | None:
    """The config of --config (a file or a preset name; default tiny) and the overrides; None when --check-config
    asked only to print it (done here)."""
    config = load_config(preset_path(args.config or "tiny"), args.overrides)
    if args.check_config:
        print(to_yaml(config), end="")
        return None
    return config


def _add_config_options(parser: argparse.ArgumentParser, overrides_example: str, progress: str | None = None,
                        config_help: str = "YAML config file or preset name in configs/ (default: tiny)") -> None:
    """--config, --check-config, optionally --no-progress, and the trailing dotted overrides."""
    parser.add_argument("--config", help=config_help)
    parser.add_argument("--check-config", action="store_true", help="validate the config, print it, and exit")
    if progress is not None:
        parser.add_argument("--no-progress", action="store_true", help=progress)
    parser.add_argument("overrides", nargs="*", help=f"dotted overrides, e.g. {overrides_example}")


def _train(args: argparse.Namespace) -> int:
    if args.resume and (args.config or args.overrides):
        raise ConfigError("--resume continues a run with its own saved config; drop --config and the overrides")
    config = load_config(preset_path(args.config or ("tiny" if not args.resume else None)), args.overrides)
    if args.check_config:
        print(to_yaml(config), end="")
        return 0
    from cooper.launcher.launch import existing_run, train

    resume = args.resume
    if args.resume_existing and resume is None:
        resume = existing_run(config)
    train(config, resume=resume, progress=not args.no_progress, workers=args.workers, in_process=args.in_process)
    return 0


def _experiment(args: argparse.Namespace) -> int:
    if args.parallel < 1 or args.best_of_n < 0:
        raise ConfigError("--parallel must be at least 1 and --best-of-n at least 0")
    from cooper.modes import EXPERIMENT_LABELS

    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    unknown = [m for m in modes if m not in EXPERIMENT_LABELS]
    if unknown or not modes:
        raise ConfigError(f"--modes takes {', '.join(EXPERIMENT_LABELS)}; got {args.modes!r}")
    config = _preset_config(args)
    if config is None:
        return 0
    from cooper.experiments.experiment import run_experiment

    _, verdict = run_experiment(config, modes, seeds=args.seeds, parallel=args.parallel,
                                best_of_n_samples=args.best_of_n, progress=not args.no_progress,
                                no_action_control=args.no_action_control)
    return 1 if args.strict and not verdict["reproduced"] else 0


EXPERIMENT_EPILOG = """\
Every (mode, seed) is an ordinary `cooper train` run with the same config but for run.mode and run.seed, in
<output_dir>/<name>-<mode>-s<seed>/. The comparison goes to <output_dir>/<name>/: compare.png (curves per mode,
mean over seeds), overoptimization.png (verifier accuracy and training reward against sqrt KL from the initial
policy, with best-of-n of the initial VerifyRM as the no-training baseline), rm_health.png (AUROC of VerifyRM
against the verifier on the policy's samples, false-positive rate, pair accuracy), results.md and results.json
(per mode and seed: test accuracy before and after, training reward at start and end, AUROC; and whether the
paper's finding was reproduced, per seed: rule's held-out accuracy rises by 0.15 or more; static is hacked, its
proxy-gold gap (training reward minus the verifier's accuracy on the same rollouts) widening by 0.25 or more while
its held-out accuracy ends 0.10 or more below the start; cooper ends within 0.05 of rule, its VerifyRM's AUROC
against the verifier on the policy's samples 0.8 or more over the second half; cooper/experiments/reproduction.py).

Examples:
  cooper experiment                                   # the tiny preset, one seed
  cooper experiment --seeds 0,1,2 --parallel 2        # what bench/experiment.py runs
  cooper experiment --modes static,cooper run.steps=40
  cooper experiment --modes static --seeds 1,2,3 --no-action-control alarm.mode=act   # the alarm acting vs not
"""


def _seed_list(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are integers separated by commas, e.g. 0,1,2 (got {text!r})") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"give one or more distinct seeds, e.g. 0,1,2 (got {text!r})")
    return seeds


ANNOTATE_EPILOG = """\
Hybrid annotation (docs/design.md, section 2.5): the rule verifier and the generator's LLM judge each label every triple,
and only the triples they agree on are written, with "label" (true = correct) and both verdicts. The verifier and
the generator start locally unless <service>.server.address names running ones; the judge is
generator.assistant (e.g. backend=openai with base_url, or backend=vllm with a model). Input: JSON Lines with
"question", "reference" (or "answer") and "completion". Prints counts, then one JSON line.
Examples:
  cooper annotate triples.jsonl -o labelled.jsonl --config qwen2.5-1.5b-cooper \\
      generator.assistant.backend=openai generator.assistant.base_url=http://localhost:8001/v1 \\
      generator.assistant.model_name=Qwen2.5-7B-Instruct
  cooper pretrain-rm labelled.jsonl -o models/verify-rm --config qwen2.5-1.5b-cooper \\
      reward.model=Qwen/Qwen2.5-Math-1.5B-Instruct
  cooper train --config configs/qwen2.5-1.5b-cooper.yaml reward.model=models/verify-rm
"""


def _annotate(args: argparse.Namespace) -> int:
    config = _preset_config(args)
    if config is None:
        return 0

    from cooper.annotation import run_annotation

    stats = run_annotation(config, args.input, args.output, args.chunk_size, progress=not args.no_progress,
                           with_judge=not args.without_judge)
    if args.without_judge:
        print(f"{stats.total} triples: the verifier labelled {stats.verifier_labelled} ({stats.kept_correct} correct, "
              f"{stats.kept_incorrect} incorrect), no judge; {stats.agreed} written to {args.output}")
    else:
        print(f"{stats.total} triples: the verifier labelled {stats.verifier_labelled}, the judge "
              f"{stats.judge_labelled}; they agreed on {stats.agreed} ({stats.kept_correct} correct, "
              f"{stats.kept_incorrect} incorrect) and disagreed on {stats.disagreed} (the judge alone called "
              f"{stats.judge_only_correct} right, the verifier alone {stats.verifier_only_correct}); {stats.agreed} "
              f"written to {args.output}")
    print(json.dumps({"input": args.input, "output": args.output, **stats.as_dict()}))
    return 0


PRETRAIN_EPILOG = """\
The initial VerifyRM of the paper (docs/design.md, section 2.5): reward.model (a base model: a hub id, a model
directory, or a tiny name) with a one-output head, trained with binary cross-entropy on labelled triples, then
written as a model directory that reward.model can name. Input: JSON Lines with "question", "reference" (or
"answer"), "completion" and a boolean "label": what `cooper annotate` writes. A share of the triples (--holdout) is
held out and scored before and after, so the printed accuracy says whether the training took. Prints one JSON line.
Examples:
  cooper pretrain-rm labelled.jsonl -o models/verify-rm --config qwen2.5-1.5b-cooper \\
      reward.model=Qwen/Qwen2.5-Math-1.5B-Instruct
  cooper eval-rm verifybench.jsonl --config qwen2.5-1.5b-cooper reward.model=models/verify-rm
  cooper train --config qwen2.5-1.5b-cooper reward.model=models/verify-rm
"""


def _pretrain_rm(args: argparse.Namespace) -> int:
    config = _preset_config(args)
    if config is None:
        return 0

    from cooper.annotation import pretrain_reward_model, read_labelled

    if not 0 <= args.holdout < 1:
        raise ConfigError(f"--holdout is a share of the triples in [0, 1); got {args.holdout}")
    result = pretrain_reward_model(config.reward, read_labelled(args.input), args.output, args.epochs, args.lr,
                                   args.batch_size, args.holdout, args.seed, progress=not args.no_progress)
    print(f"VerifyRM from {result['model']} trained on {result['train']} triples, saved to {result['output']}; "
          f"held-out accuracy {result['heldout_accuracy_before']} -> {result['heldout_accuracy_after']}. "
          f"Use it with reward.model={result['output']}")
    print(json.dumps(result))
    return 0


EVAL_RM_EPILOG = """\
Judges every completion of a labelled benchmark in VerifyBench's format (JSON Lines: question, answer, completion,
gold_correct true/false, optional answer_type) twice: VerifyRM (reward.model; score > 0.5 says correct) and the rule
verifier (math-verify; CORRECT says correct). Prints accuracy per answer type and overall for both, VerifyRM's AUROC,
then one JSON line. FILE may be `tiny`: a benchmark built from the tiny task. With reward.server.address (or
verifier.server.address) set, the running service judges instead, with the reward model's current version.
Examples:
  cooper eval-rm verifybench.jsonl -o report.json --config configs/qwen2.5-1.5b-cooper.yaml \\
      reward.model=models/verify-rm
  cooper eval-rm tiny                                   # the tiny preset's pretrained VerifyRM
  cooper eval-rm verifybench.jsonl --config configs/qwen2.5-1.5b-cooper.yaml \\
      reward.model=runs/cooper-x/checkpoints/reward/<checkpoint>
"""


def _eval_rm(args: argparse.Namespace) -> int:
    config = _preset_config(args)
    if config is None:
        return 0

    from cooper.eval_rm import run_eval_rm
    from cooper.evaluation.rm_bench import format_table

    report = run_eval_rm(config, args.input)
    print(f"{args.input}: {report['n']} completions ({report['gold_correct']} labelled correct); "
          f"VerifyRM {report['reward_model']}" + ("" if report["reward_version"] is None
                                                  else f" version {report['reward_version']}"))
    print(format_table(report))
    line = json.dumps(report)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(line + "\n", encoding="utf-8")
    print(line)
    return 0


DATA_EPILOG = """\
Formats (fields as published; the module docstring of cooper/dataset_formats.py has the details):
  gsm8k          question, answer ending in "#### 42"           -> the number after ####
  svamp          Body + Question (or question_concat), Answer   -> Answer as a number (8.0 -> 8)
  math500        problem, answer (or the last \\boxed{} of solution)
  olympiadbench  question, final_answer (a list, joined with ", ")
  math_odyssey   question or problem, answer (or the last \\boxed{} of reasoning)
Input: JSON Lines, a JSON array, or parquet (needs pyarrow). Output: JSON Lines with id, question, answer and
data_source, what data.train_path and data.test_paths read.
Examples:
  cooper data gsm8k/train.jsonl -o data/gsm8k-train.jsonl
  cooper data MATH-500/test.jsonl -o data/math500.jsonl
  cooper data SVAMP.json -o data/svamp.jsonl --format svamp
  cooper train data.preset=files data.train_path=data/gsm8k-train.jsonl data.test_paths.math500=data/math500.jsonl
"""


def _data(args: argparse.Namespace) -> int:

    from cooper.dataset_formats import convert_file

    result = convert_file(args.input, args.output, args.format, args.source, args.skip_invalid)
    print(f"{len(result.rows)} rows of {result.format} from {args.input} written to {args.output}"
          + (f"; {len(result.skipped)} skipped (first: {result.skipped[0]})" if result.skipped else ""))
    print(json.dumps({"input": args.input, "output": args.output, "format": result.format, "rows": len(result.rows),
                      "skipped": len(result.skipped)}))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cooper",
        description="Cooper: GRPO with a reward model trained alongside the policy.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    parser.add_argument("--version", action="version", version=f"cooper {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run one service (gRPC; the reward service also serves HTTP)",
                           epilog=SERVE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("service", choices=sorted(SERVICES), help="which service to run")
    serve.add_argument("--config", help="YAML config file or preset name in configs/ (default: the built-in "
                                        "defaults, the tiny models)")
    serve.add_argument("--host", help="interface to bind (overrides <service>.server.host)")
    serve.add_argument("--port", type=int, help="gRPC port; 0 picks a free one (overrides <service>.server.port)")
    serve.add_argument("--ready-file", help="write the bound ports here as JSON once serving")
    serve.add_argument("--check-config", action="store_true", help="validate the config, print it, and exit")
    serve.add_argument("overrides", nargs="*", help="dotted overrides, e.g. verifier.workers=2")

    train = sub.add_parser(
        "train", help="train a policy (no arguments: the tiny preset, everything local)", epilog=TRAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("--resume", metavar="RUN", help="continue the run RUN (a name under run.output_dir, or a path)")
    train.add_argument("--resume-existing", action="store_true",
                       help="if run.name names a run that exists, resume it instead of failing (restarted containers)")
    train.add_argument("--workers", type=int, default=3, help="stage worker threads (default 3)")
    train.add_argument("--in-process", action="store_true",
                       help="start no service processes: the stages call the services' cores in this process (for "
                            "debugging with one debugger, and profiling; rule-based generator strategies only)")
    _add_config_options(train, "run.steps=5 run.mode=static", progress="no progress bar (logs only)")

    experiment = sub.add_parser(
        "experiment", help="run rule, static and cooper on the same data and seeds, compare them, judge the finding",
        epilog=EXPERIMENT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    experiment.add_argument("--modes", default="rule,static,cooper",
                            help="comma-separated modes (default: all three); cooper-paper adds the paper's recipe "
                                 "beside the preset's cooper, cooper-rollouts cooper with the rejected rollouts alone "
                                 "as negatives")
    experiment.add_argument("--seeds", type=_seed_list, default=None,
                            help="comma-separated run seeds, e.g. 0,1,2 (default: run.seed alone)")
    experiment.add_argument("--parallel", type=int, default=1,
                            help="runs at a time (each is a `cooper train` with its own services; default 1)")
    experiment.add_argument("--best-of-n", type=int, default=32, metavar="N",
                            help="samples per test problem for the best-of-n baseline of the initial VerifyRM "
                                 "(0: skip; default 32)")
    experiment.add_argument("--no-action-control", action="store_true",
                            help="with alarm.mode=act: also run each static/cooper run with the alarm only warning "
                                 "(label <mode>-noaction), and print the held-out accuracy of both")
    experiment.add_argument("--strict", action="store_true",
                            help="exit 1 when the finding was not reproduced (for scripts)")
    _add_config_options(experiment, "run.steps=20 run.seed=1", progress="no progress bars")

    annotate = sub.add_parser(
        "annotate", help="label triples with the verifier and an LLM judge; keep those they agree on",
        epilog=ANNOTATE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    annotate.add_argument("input", help="JSON Lines: question, reference (or answer), completion")
    annotate.add_argument("-o", "--output", required=True, help="where the kept triples go (JSON Lines)")
    annotate.add_argument("--chunk-size", type=int, default=64, help="triples per verifier and judge call")
    annotate.add_argument("--without-judge", action="store_true",
                          help="label by the verifier alone and keep every triple it labels (no generator starts): "
                               "where no judge is at hand, or one too small to give verdicts")
    _add_config_options(annotate, "generator.assistant.backend=openai", progress="no progress bar")

    pretrain = sub.add_parser(
        "pretrain-rm", help="train the initial VerifyRM (BCE) on labelled triples and save it as a model directory",
        epilog=PRETRAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    pretrain.add_argument("input", help="JSON Lines with question, reference, completion and a boolean label")
    pretrain.add_argument("-o", "--output", required=True, help="model directory to write (reward.model can name it)")
    pretrain.add_argument("--epochs", type=int, default=3, help="passes over the triples (paper: 3)")
    pretrain.add_argument("--lr", type=float, default=2e-5, help="AdamW learning rate (paper: 2e-5)")
    pretrain.add_argument("--batch-size", type=int, default=16, help="triples per optimizer step")
    pretrain.add_argument("--holdout", type=float, default=0.05, help="share held out to report accuracy (0: none)")
    pretrain.add_argument("--seed", type=int, default=0, help="shuffles the triples and picks the held-out share")
    _add_config_options(pretrain, "reward.model=Qwen/Qwen2.5-Math-1.5B", progress="no progress bar",
                        config_help="YAML config file or preset name in configs/ (default: tiny); the base model is "
                        "reward.model")

    eval_rm = sub.add_parser(
        "eval-rm", help="accuracy of VerifyRM and of the rule verifier on a labelled benchmark (VerifyBench format)",
        epilog=EVAL_RM_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    eval_rm.add_argument("input", metavar="FILE", help="JSON Lines in VerifyBench's format, or `tiny`")
    eval_rm.add_argument("-o", "--output", help="also write the JSON report here")
    _add_config_options(eval_rm, "reward.model=models/verify-rm", config_help="YAML config file or preset name "
                        "in configs/ (default: tiny); the model is reward.model")

    data = sub.add_parser(
        "data", help="convert a published dataset (GSM8K, SVAMP, MATH500, OlympiadBench, Math Odyssey) to Cooper's "
        "JSON Lines", epilog=DATA_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    data.add_argument("input", help="the dataset file: JSON Lines, a JSON array, or parquet")
    data.add_argument("-o", "--output", required=True, help="JSON Lines to write (id, question, answer, data_source)")
    data.add_argument("--format", help="gsm8k, svamp, math500, olympiadbench or math_odyssey (default: detected)")
    data.add_argument("--source", help="data_source of the rows and prefix of generated ids (default: the format)")
    data.add_argument("--skip-invalid", action="store_true",
                      help="skip rows without a usable question or answer (default: fail on the first)")

    show = sub.add_parser("config", help="print the resolved config as YAML (validates it)")
    show.add_argument("--config", help="YAML config file or preset name (default: tiny, what `cooper train` runs; "
                                       "`--config none` shows the built-in defaults alone)")
    show.add_argument("overrides", nargs="*", help="dotted overrides")
    for command in sub.choices.values():  # also after the command (`cooper train --log-level DEBUG`)
        command.add_argument("--log-level", default=argparse.SUPPRESS, help="as before the command")
    return parser


def _load(args: argparse.Namespace, extra: Sequence[str] = ()) -> CooperConfig:
    return load_config(preset_path(args.config), [*extra, *args.overrides])


def _serve(args: argparse.Namespace) -> int:
    extra = []
    if args.host is not None:
        extra.append(f"{args.service}.server.host={args.host}")
    if args.port is not None:
        extra.append(f"{args.service}.server.port={args.port}")
    config = _load(args, extra)
    if args.check_config:
        print(to_yaml(config), end="")
        print(f"config ok for service {args.service}", file=sys.stderr)
        return 0
    from cooper.runtime.processes import remove_own_temp_dir_at_exit
    from cooper.runtime.server import run_service

    remove_own_temp_dir_at_exit()
    if args.service == "policy":
        from cooper.services.policy.placement import launched

        place = launched()
        if place is not None and place.rank > 0:  # under torchrun: only global rank 0 serves; this one follows it
            from cooper.services.policy.ranks.follower import follow

            return follow(place, group_timeout_s=config.policy.distributed.timeout_s)
    if args.service == "reward":
        # VerifyRM's model process starts before this process imports the service (torch, FastAPI, ...), so that
        # its own start-up runs beside those imports, not after them (cooper/services/reward/model_process.py).
        from cooper.services.reward.model_process import start_early

        start_early(config.reward)
    module = importlib.import_module(SERVICES[args.service])
    return run_service(module.create_service, config, ready_file=args.ready_file)


def _input_errors() -> tuple[type[Exception], ...]:
    """The errors that mean bad input (exit 2). Imported only when an error is being handled: their modules belong
    to the subcommands that raise them, and every service process starts through this module."""
    from cooper.annotation import AnnotationInputError
    from cooper.dataset_formats import DatasetFormatError
    from cooper.evaluation.rm_bench import BenchInputError

    return ConfigError, AnnotationInputError, BenchInputError, DatasetFormatError


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line as main() reads it; an unknown flag or argument exits 2 with argparse's message."""
    parser = _parser()
    # Overrides may follow options (`serve verifier --port 1 a.b=2`), which argparse alone leaves unparsed.
    args, rest = parser.parse_known_args(argv)
    stray = [item for item in rest if item.startswith("-") or "=" not in item]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    args.overrides = [*getattr(args, "overrides", []), *rest]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # `kill -USR1 PID` prints every thread's stack to stderr (a service's: to its log) and the process goes on:
    # where a process that seems stuck is, without stopping it or attaching a debugger. To descriptor 2, not
    # sys.stderr, which need not have one (main() called in-process, under a test's capture).
    faulthandler.register(signal.SIGUSR1, file=2, all_threads=True)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "train":
            return _train(args)
        if args.command == "experiment":
            return _experiment(args)
        if args.command == "annotate":
            return _annotate(args)
        if args.command == "pretrain-rm":
            return _pretrain_rm(args)
        if args.command == "eval-rm":
            return _eval_rm(args)
        if args.command == "data":
            return _data(args)
        if args.command == "config":
            shown = None if args.config == "none" else preset_path(args.config or "tiny")
            print(to_yaml(load_config(shown, args.overrides)), end="")
            return 0
    except _input_errors() as err:
        print(f"cooper: {err}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError, ValueError) as err:  # missing files, services that fail to start, failed jobs
        print(f"cooper: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
