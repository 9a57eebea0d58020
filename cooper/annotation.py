"""Hybrid annotation and VerifyRM pre-training (docs/design.md section 2.5): how the first VerifyRM is made.

The rule verifier and an LLM judge each label every (question, reference, completion) triple; a triple is kept,
with that label, only when both give one and they agree (paper: 65K triples -> 58.7K). Without a judge (none at
hand, or one too small to give verdicts: SmolLM2-135M-Instruct gives none) every triple the verifier labels is kept
with its label: the verifier's blind spots (answers it cannot parse) then go into VerifyRM unchecked. The kept triples train the
initial VerifyRM with BCE (paper: lr 2e-5, 3 epochs), which `reward.model` then names.

`annotate` is a pure loop over two labelling functions (the CLI passes gRPC calls to the verifier and the
generator's Judge); files are JSON Lines: in, `question`, `reference` (or `answer`) and `completion` per line; out,
the kept triples with `label` (true = correct) and both verdicts.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cooper.config import RewardConfig
from cooper.jsonl import read_json_objects
from cooper.runtime.files import write_atomically
from cooper.services.reward.items import LabelledTriple, ScoreItem

# verdict names as the services send them (cooper.verifier.v1.Verdict, cooper.generator.v1.Judgment)
VERIFIER_LABELS = {"CORRECT": True, "INCORRECT": False}  # NO_ANSWER, TIMEOUT, ERROR: no label
JUDGE_LABELS = {"YES": True, "NO": False}  # UNKNOWN: no label


class AnnotationInputError(ValueError):
    """A line of an input file that is not a usable triple; the message names the file and line."""


@dataclass(frozen=True)
class Annotated:
    triple: ScoreItem
    verifier: str
    judge: str | None  # None: labelled without a judge

    @property
    def label(self) -> bool | None:
        return agreed_label(self.verifier, self.judge)


@dataclass
class AnnotationStats:
    total: int = 0
    verifier_labelled: int = 0
    judge_labelled: int = 0
    disagreed: int = 0  # both labelled, differently: the two below
    judge_only_correct: int = 0  # the judge called it right, the verifier wrong (a missed answer, or the judge's error)
    verifier_only_correct: int = 0  # the verifier called it right, the judge wrong
    kept_correct: int = 0
    kept_incorrect: int = 0

    @property
    def agreed(self) -> int:
        return self.kept_correct + self.kept_incorrect

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "agreed": self.agreed}


def agreed_label(verifier: str, judge: str | None) -> bool | None:
    """True or False when the verifier and the judge both label the triple and agree, or the verifier labels it and
    there is no judge (None); None otherwise."""
    by_verifier = VERIFIER_LABELS.get(verifier)
    if judge is None:
        return by_verifier
    by_judge = JUDGE_LABELS.get(judge)
    if by_verifier is None or by_judge is None or by_verifier != by_judge:
        return None
    return by_verifier


def _read_jsonl(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    return read_json_objects(path, AnnotationInputError)


def _text(path: str | Path, number: int, row: dict[str, Any], *names: str) -> str:
    for name in names:
        if name in row:
            if not isinstance(row[name], str):
                raise AnnotationInputError(f"{path}:{number}: {name!r} must be a string")
            return row[name]
    raise AnnotationInputError(f"{path}:{number}: missing {' or '.join(repr(n) for n in names)}")


def _item(path: str | Path, number: int, row: dict[str, Any]) -> ScoreItem:
    return ScoreItem(_text(path, number, row, "question"), _text(path, number, row, "reference", "answer"),
                     _text(path, number, row, "completion"))


def read_triples(path: str | Path) -> list[ScoreItem]:
    """`question`, `reference` (or `answer`) and `completion` per line."""
    triples = [_item(path, number, row) for number, row in _read_jsonl(path)]
    if not triples:
        raise AnnotationInputError(f"{path}: no triples in the file")
    return triples


def read_labelled(path: str | Path) -> list[tuple[ScoreItem, bool]]:
    """What annotate wrote (or any file with the triple's fields and a boolean `label`)."""
    out = []
    for number, row in _read_jsonl(path):
        label = row.get("label")
        if not isinstance(label, bool):
            raise AnnotationInputError(f"{path}:{number}: 'label' must be true or false")
        out.append((_item(path, number, row), label))
    if not out:
        raise AnnotationInputError(f"{path}: no labelled triples in the file")
    return out


def annotate(
    triples: Sequence[ScoreItem],
    verify: Callable[[Sequence[ScoreItem]], list[str]],
    judge: Callable[[Sequence[ScoreItem]], list[str]] | None,
    chunk_size: int = 64,
    on_chunk: Callable[[int], None] | None = None,
) -> tuple[list[Annotated], AnnotationStats]:
    """Label every triple with both functions (the verifier alone where `judge` is None), chunk by chunk; the kept
    ones (in input order) and the counts."""
    kept: list[Annotated] = []
    stats = AnnotationStats()
    for start in range(0, len(triples), chunk_size):
        chunk = triples[start : start + chunk_size]
        verdicts = verify(chunk)
        judgments: list[str | None] = [None] * len(chunk) if judge is None else list(judge(chunk))
        if len(verdicts) != len(chunk) or len(judgments) != len(chunk):
            raise RuntimeError(f"expected {len(chunk)} verdicts from each labeller, got {len(verdicts)} and "
                               f"{len(judgments)}")
        for triple, verdict, judgment in zip(chunk, verdicts, judgments, strict=True):
            stats.total += 1
            by_verifier = VERIFIER_LABELS.get(verdict)
            by_judge = by_verifier if judgment is None else JUDGE_LABELS.get(judgment)
            stats.verifier_labelled += by_verifier is not None
            stats.judge_labelled += judgment is not None and by_judge is not None
            if by_verifier is None or by_judge is None:
                continue
            if by_verifier != by_judge:
                stats.disagreed += 1
                stats.judge_only_correct += by_judge
                stats.verifier_only_correct += by_verifier
                continue
            stats.kept_correct += by_verifier
            stats.kept_incorrect += not by_verifier
            kept.append(Annotated(triple, verdict, judgment))
        if on_chunk is not None:
            on_chunk(len(chunk))
    return kept, stats


def write_annotated(path: str | Path, kept: Sequence[Annotated]) -> None:
    """JSON Lines, written to a temporary file and renamed into place."""
    lines = [json.dumps({**asdict(a.triple), "label": a.label, "verifier": a.verifier, "judge": a.judge})
             for a in kept]
    write_atomically(path, "".join(line + "\n" for line in lines))


# ----- pre-training -----


def pretrain_reward_model(
    config: RewardConfig, labelled: Sequence[tuple[ScoreItem, bool]], output_dir: str | Path, epochs: int = 3,
    lr: float = 2e-5, batch_size: int = 16, holdout: float = 0.05, seed: int = 0, progress: bool = False,
) -> dict[str, Any]:
    """BCE-train config.model on the labelled triples, save it as a loadable model directory (atomically), and
    report accuracy on a held-out share before and after (the share is drawn with `seed`). With `progress`, a bar
    counts the triples trained on over all epochs, with the last batch's loss."""
    import torch
    from tqdm import tqdm

    from cooper.runtime.models import resolve_model
    from cooper.services.reward.verify_rm import VerifyRM

    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    triples = [LabelledTriple(t.question, t.reference, t.completion, label) for t, label in labelled]
    random.Random(seed).shuffle(triples)
    held = int(len(triples) * holdout)
    if holdout > 0 and held == 0 and len(triples) > 1:
        held = 1
    evaluation, training = triples[:held], triples[held:]
    rm = VerifyRM.load(resolve_model(config.model, "reward"), config.optim, config.max_length, config.device,
                       config.dtype)

    def accuracy() -> float | None:
        if not evaluation:
            return None
        logits = rm.logits(rm.encode([ScoreItem(t.question, t.reference, t.completion) for t in evaluation]))
        return sum((x > 0) == t.label for x, t in zip(logits, evaluation, strict=True)) / len(evaluation)

    before = accuracy()
    with tqdm(total=len(training) * epochs, desc="pretraining VerifyRM", unit="triple", disable=not progress) as bar:

        def advance(triples: int, loss: float) -> None:
            bar.update(triples)
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

        trained = rm.pretrain(training, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed, on_step=advance)
    after = accuracy()
    target = Path(output_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        rm.model.save_pretrained(tmp, safe_serialization=True)
        rm.tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {
        "model": config.model, "output": str(target), "train": len(training), "heldout": len(evaluation),
        "positives": sum(t.label for t in triples), "epochs": epochs, "lr": lr,
        "train_loss": round(trained["loss"], 4), "train_accuracy": round(trained["accuracy"], 4),
        "heldout_accuracy_before": None if before is None else round(before, 4),
        "heldout_accuracy_after": None if after is None else round(after, 4),
    }


# ----- the command -----


def run_annotation(config: Any, input_path: str | Path, output_path: str | Path, chunk_size: int = 64,
                   progress: bool = True, with_judge: bool = True) -> AnnotationStats:
    """`cooper annotate`: label the input with the verifier and the generator's judge (the verifier alone without
    `with_judge`: no generator starts), write the kept triples.

    Services named by <service>.server.address are used as they are; the others start here on free loopback ports
    for the duration (their logs go to a temporary directory, and a start-up failure shows the log's tail).
    """
    import grpc
    from tqdm import tqdm

    from cooper.config import with_overrides
    from cooper.launcher.launch import write_configs
    from cooper.launcher.local import LocalServices
    from cooper.services.generator.client import GeneratorClient
    from cooper.services.generator.messages import JudgeItem, Judgment
    from cooper.services.verifier.client import VerifierClient
    from cooper.services.verifier.messages import Verdict

    triples = read_triples(input_path)
    names = ("verifier", "generator") if with_judge else ("verifier",)
    local = [f"{name}.server.{key}={value}" for name in names if not getattr(config, name).server.address
             for key, value in (("host", "127.0.0.1"), ("port", 0), ("metrics_port", "null"))]
    config = with_overrides(config, local)
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="cooper-annotate-"))
        services = stack.enter_context(LocalServices(config, write_configs(config, Path(tmp)), Path(tmp), names))
        verifier = stack.enter_context(VerifierClient(services.addresses["verifier"], config.verifier.server,
                                                      config.security))
        generator = stack.enter_context(GeneratorClient(services.addresses["generator"], config.generator.server,
                                                        config.security)) if with_judge else None
        bar = stack.enter_context(tqdm(total=len(triples), desc="annotating", unit="triple", disable=not progress))

        def verify(chunk: Sequence[ScoreItem]) -> list[str]:
            results = verifier.verify_pairs([(t.completion, t.reference) for t in chunk])
            return [Verdict.Name(r.verdict) for r in results]

        def judge(chunk: Sequence[ScoreItem]) -> list[str]:
            assert generator is not None
            items = [JudgeItem(question=t.question, reference=t.reference, completion=t.completion) for t in chunk]
            try:
                return [Judgment.Name(r.verdict) for r in generator.judge(items)]
            except grpc.RpcError as err:  # a judge too slow for the chunk is the common case: say what to change
                raise RuntimeError(
                    f"the generator's judge failed on a chunk of {len(chunk)} triples ({err.code().name}: "
                    f"{err.details()}); a slow judge needs a smaller --chunk-size or a longer "
                    f"generator.server.deadline_s (now {config.generator.server.deadline_s:g} s)"
                ) from err

        kept, stats = annotate(triples, verify, judge if with_judge else None, chunk_size, bar.update)
    write_annotated(output_path, kept)
    return stats
