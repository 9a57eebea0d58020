"""VerifyRM core on the real tiny model: template, truncation, padding, Bradley-Terry updates, BCE pre-training."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import replace

import torch
from reward_testkit import tiny_items, tiny_pairs

from cooper.config import OptimConfig
from cooper.services.reward.items import UpdateStats
from cooper.services.reward.verify_rm import (
    LabelledTriple,
    ScoreItem,
    VerifyRM,
    bradley_terry_loss,
    calibration_loss,
    format_input,
    pair_accuracy,
    truncate_middle,
)


def test_template_is_exactly_the_design_text() -> None:
    text = format_input("What is 2+3?", "5", "2+3 = \\boxed{5}")
    assert text == (
        "<question>What is 2+3?</question>\n<reference_answer>5</reference_answer>\n"
        "<completion>2+3 = \\boxed{5}</completion>"
    )


def test_truncation_keeps_first_500_and_last_1000_characters() -> None:
    assert truncate_middle("x" * 1500) == "x" * 1500  # at the limit: untouched
    long = "".join(chr(ord("a") + i % 26) for i in range(4000))
    cut = truncate_middle(long)
    assert len(cut) == 1500 and cut == long[:500] + long[-1000:]
    question, reference, completion = "Q" * 3000, "R" * 1200 + "S" * 800, "C" * 1600
    # The question is kept whole; reference and completion are cut in the middle.
    assert format_input(question, reference, completion) == (
        f"<question>{question}</question>\n<reference_answer>{'R' * 500}{'R' * 200}{'S' * 800}</reference_answer>\n"
        f"<completion>{'C' * 1500}</completion>"
    )


def test_bradley_terry_loss_equals_hand_computation() -> None:
    pos = torch.tensor([2.0, -1.0, 0.5])
    neg = torch.tensor([1.0, 0.0, 3.0])
    hand = sum(-math.log(1 / (1 + math.exp(-(p - n)))) for p, n in zip([2.0, -1.0, 0.5], [1.0, 0.0, 3.0],
                                                                          strict=True)) / 3
    assert abs(bradley_terry_loss(pos, neg).item() - hand) < 1e-6
    assert pair_accuracy([2.0, -1.0, 0.5], [1.0, 0.0, 3.0]) == 1 / 3
    assert pair_accuracy([1.0], [1.0]) == 0.0  # a tie is not a win


def test_batched_scores_equal_one_at_a_time(rm: VerifyRM) -> None:
    items = tiny_items(16)
    lengths = {len(ids) for ids in rm.encode(items)}
    assert len(lengths) > 5  # the batch really pads
    batched = rm.score(items, batch_size=16)
    single = [rm.score([item])[0] for item in items]
    assert max(abs(a[1] - b[1]) for a, b in zip(batched, single, strict=True)) <= 1e-5
    assert max(abs(a[0] - b[0]) for a, b in zip(batched, single, strict=True)) <= 1e-5


def test_special_tokens_in_text_are_plain_text(rm: VerifyRM) -> None:
    pad = rm.tokenizer.pad_token
    [ids] = rm.encode([ScoreItem("q", "1", f"answer {pad}")])
    assert rm.pad_id not in ids  # so it cannot move the pooling point


def test_encoder_ids_are_those_of_the_tokenizer_call(rm: VerifyRM) -> None:
    """The Encoder calls the fast tokenizer's Rust side directly; the ids must be transformers' own."""
    specials = "".join(rm.tokenizer.all_special_tokens)
    items = tiny_items(40) + [ScoreItem(f"q {specials}", specials, f"{specials} answer {rm.tokenizer.pad_token}")]
    texts = [format_input(i.question, i.reference, i.completion) for i in items]
    expected = rm.tokenizer(texts, split_special_tokens=True)["input_ids"]
    assert rm.encode(items) == expected
    for item, ids in zip(items, expected, strict=True):  # one item, as most requests are (its own fast path)
        assert rm.encode([item]) == [ids]
    rm.tokenizer(texts[:1], truncation=True, max_length=8)  # someone leaves truncation set: the slow path, same ids
    assert rm.encode(items) == rm.tokenizer(texts, split_special_tokens=True)["input_ids"]


def test_long_input_keeps_question_and_end_of_completion(rm: VerifyRM) -> None:
    rm.encoder.max_length = 64
    completion = "filler words here. " * 40 + "The answer is \\boxed{42}."
    [ids] = rm.encode([ScoreItem("What is 6*7?", "42", completion)])
    text = rm.tokenizer.decode(ids)
    assert len(ids) == 64
    assert text.startswith("<question>What is 6*7?</question>") and text.endswith("\\boxed{42}.</completion>")


def test_repeated_updates_rank_positives_above_negatives(tiny_rm_dir: str) -> None:
    # lr 1e-3 and 30 updates: pair accuracy of 6 pairs moves in steps of 1/6, and at lr 1e-2 it swung between 0.67
    # and 1.0 from update to update, so "reached 0.95 once" was luck. Judged on the last five updates instead:
    # over four pair seeds, their mean loss was 0.01-0.13 (untrained: log 2) and their mean accuracy 0.93-1.0.
    rm = VerifyRM.load(tiny_rm_dir, OptimConfig(lr=1e-3, micro_batch_size=12), device="cpu")
    pairs = tiny_pairs(6)
    history = [rm.update(pairs) for _ in range(30)]
    first, last = history[0], history[-5:]
    assert not first.skipped and first.version == 1 and history[-1].version == 30
    assert first.loss > 0.6  # untrained: near log 2
    assert statistics.mean(s.loss for s in last) < 0.5 * first.loss
    assert statistics.mean(s.pair_accuracy_after for s in last) >= 0.8
    assert max(s.pair_accuracy_after for s in last) == 1.0
    assert rm.score([ScoreItem(p.question, p.reference, p.positive) for p in pairs]) != \
        rm.score([ScoreItem(p.question, p.reference, p.negative) for p in pairs])
    assert rm.version == 30


def test_calibration_loss_equals_hand_computation() -> None:
    pos, neg = [2.0, -1.0], [0.5, -3.0]
    bce = [math.log(1 + math.exp(-p)) for p in pos] + [math.log(1 + math.exp(n)) for n in neg]
    assert abs(calibration_loss(torch.tensor(pos), torch.tensor(neg)).item() - sum(bce) / 4) < 1e-6


def test_calibration_pins_the_threshold_that_bradley_terry_leaves_free(tiny_rm_dir: str) -> None:
    # Bradley-Terry alone only orders each pair; with the calibration term the positives end above 0.5 and the
    # negatives below, which is what the discrete reward 1[p > 0.5] reads.
    pairs = tiny_pairs(6)
    calibrated = VerifyRM.load(tiny_rm_dir, OptimConfig(lr=1e-3, micro_batch_size=12), device="cpu")
    for _ in range(30):
        stats = calibrated.update(pairs, calibration_weight=1.0)
    positives = [s for s, _ in calibrated.score([ScoreItem(p.question, p.reference, p.positive) for p in pairs])]
    negatives = [s for s, _ in calibrated.score([ScoreItem(p.question, p.reference, p.negative) for p in pairs])]
    assert statistics.mean(p > 0.5 for p in positives) >= 5 / 6 and statistics.mean(n < 0.5 for n in negatives) >= 5 / 6
    # The reported loss stays the Bradley-Terry loss of the fresh pairs, comparable with the paper's recipe.
    fresh = VerifyRM.load(tiny_rm_dir, OptimConfig(lr=1e-3, micro_batch_size=12), device="cpu")
    assert abs(fresh.update(pairs, calibration_weight=1.0).loss - fresh_bt_loss(tiny_rm_dir, pairs)) < 1e-5
    assert stats.version == 30


def fresh_bt_loss(tiny_rm_dir: str, pairs) -> float:  # type: ignore[no-untyped-def]
    return VerifyRM.load(tiny_rm_dir, OptimConfig(lr=1e-3, micro_batch_size=12), device="cpu").update(pairs).loss


def test_optimizer_restarts_reset_adamws_moments_at_every_nth_version(tiny_rm_dir: str) -> None:
    rm = VerifyRM.load(tiny_rm_dir, OptimConfig(lr=1e-3, micro_batch_size=12), device="cpu")
    pairs = tiny_pairs(4)

    def adam_steps() -> int:
        return int(next(iter(rm.optimizer.state.values()))["step"])

    counts = []
    for _ in range(5):
        rm.update(pairs, optimizer_steps=2, restart_every=2)
        counts.append(adam_steps())
    # Reset before the updates at versions 0, 2 and 4: the step count starts again from the reset's 2 steps.
    assert counts == [2, 4, 2, 4, 2] and rm.version == 5
    plain = VerifyRM.load(tiny_rm_dir, OptimConfig(lr=1e-3, micro_batch_size=12), device="cpu")
    for _ in range(3):
        plain.update(pairs, optimizer_steps=2)
    assert int(next(iter(plain.optimizer.state.values()))["step"]) == 6  # never reset by default


def test_update_changes_every_trained_parameter(rm: VerifyRM) -> None:
    before = {name: p.detach().clone() for name, p in rm.model.named_parameters()}
    rm.update(tiny_pairs(4))
    unchanged = [name for name, p in rm.model.named_parameters() if torch.equal(before[name], p)]
    assert unchanged == []


def test_replay_adds_to_the_gradient_but_not_to_the_reported_loss(tiny_rm_dir: str) -> None:
    fresh, replay = tiny_pairs(3), tiny_pairs(5, seed=1)
    with_replay = VerifyRM.load(tiny_rm_dir, OptimConfig(lr=3e-3, micro_batch_size=4), device="cpu")
    together = VerifyRM.load(tiny_rm_dir, OptimConfig(lr=3e-3, micro_batch_size=4), device="cpu")
    alone = VerifyRM.load(tiny_rm_dir, OptimConfig(lr=3e-3, micro_batch_size=4), device="cpu")
    stats = with_replay.update(fresh, replay)
    # The step is the one over all eight pairs ...
    assert abs(stats.grad_norm - together.update(fresh + replay).grad_norm) < 1e-5
    for a, b in zip(with_replay.model.parameters(), together.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    # ... while loss and pair accuracy are the fresh pairs': what this step's data showed the model.
    fresh_only = alone.update(fresh)
    assert abs(stats.loss - fresh_only.loss) < 1e-5
    assert stats.pair_accuracy_before == fresh_only.pair_accuracy_before
    assert stats.version == 1


def test_sampled_replay_trains_on_the_fresh_pairs_and_a_draw_of_the_replay(tiny_rm_dir: str) -> None:
    fresh, replay = tiny_pairs(2), tiny_pairs(5, seed=1)
    rm = VerifyRM.load(tiny_rm_dir, OptimConfig(lr=3e-3, micro_batch_size=4), device="cpu")
    initial = {name: value.clone() for name, value in rm.model.state_dict().items()}

    def update(pairs: list, replay: list = [], sample: int = 0) -> UpdateStats:  # noqa: B006
        # From the same weights and version each time; the first step's gradient depends on nothing else.
        rm.model.load_state_dict(initial)
        rm.version = 0
        return rm.update(pairs, replay, optimizer_steps=1, replay_sample=sample)

    stats = update(fresh, replay, sample=2)
    # The same version draws the same replayed pairs, so a restarted service trains the same step ...
    assert update(fresh, replay, sample=2).grad_norm == stats.grad_norm
    # ... which is the full-batch step over the fresh pairs and exactly one set of two replayed pairs.
    matches = [subset for subset in itertools.combinations(replay, 2)
               if abs(update(fresh + list(subset)).grad_norm - stats.grad_norm) < 1e-5]
    assert len(matches) == 1
    assert abs(update(fresh, replay).grad_norm - stats.grad_norm) > 1e-4
    # The reported loss is still the fresh pairs' alone.
    assert abs(stats.loss - update(fresh).loss) < 1e-5


def test_a_shared_positive_is_forwarded_once_with_the_same_gradient(tiny_rm_dir: str) -> None:
    # Three pairs of one group share their positive; the deduplicated pass must train exactly like three copies.
    pair = tiny_pairs(1)[0]
    pairs = [pair, replace(pair, negative=pair.negative + " 1"), replace(pair, negative=pair.negative + " 2")]
    counting, reference = (VerifyRM.load(tiny_rm_dir, OptimConfig(lr=3e-3, micro_batch_size=8), device="cpu")
                           for _ in range(2))
    forwarded: list[int] = []
    original = counting.forward
    counting.forward = lambda ids: forwarded.append(len(ids)) or original(ids)  # type: ignore[method-assign]
    stats = counting.update(pairs, calibration_weight=1.0)
    assert forwarded[0] == 4  # one positive and three negatives, not six texts
    # The gradient of the same loss over six separately forwarded texts.
    texts = [pair.positive] * 3 + [p.negative for p in pairs]
    logits = reference.forward(reference.encode([ScoreItem(pair.question, pair.reference, t) for t in texts]))
    loss = bradley_terry_loss(logits[:3], logits[3:]) + calibration_loss(logits[:3], logits[3:])
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(list(reference.model.parameters()), float("inf"))
    assert abs(stats.grad_norm - float(norm)) < 1e-5 * max(1.0, float(norm))


def test_several_optimizer_steps_are_one_version(tiny_rm_dir: str) -> None:
    pairs = tiny_pairs(4)
    once = VerifyRM.load(tiny_rm_dir, OptimConfig(lr=3e-3, micro_batch_size=8), device="cpu")
    thrice = VerifyRM.load(tiny_rm_dir, OptimConfig(lr=3e-3, micro_batch_size=8), device="cpu")
    stats = [once.update(pairs) for _ in range(3)]
    combined = thrice.update(pairs, optimizer_steps=3)
    assert (combined.version, once.version) == (1, 3)
    assert abs(combined.loss - stats[0].loss) < 1e-6  # measured before the first step
    assert abs(combined.pair_accuracy_after - stats[-1].pair_accuracy_after) < 1e-9
    for a, b in zip(once.model.parameters(), thrice.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_micro_batches_accumulate_to_the_full_batch_gradient(tiny_rm_dir: str) -> None:
    pairs = tiny_pairs(6)
    whole = VerifyRM.load(tiny_rm_dir, OptimConfig(lr=3e-3, micro_batch_size=12), device="cpu").update(pairs)
    micro = VerifyRM.load(tiny_rm_dir, OptimConfig(lr=3e-3, micro_batch_size=2), device="cpu").update(pairs)
    assert abs(whole.loss - micro.loss) < 1e-5
    assert abs(whole.grad_norm - micro.grad_norm) < 1e-4 * max(1.0, whole.grad_norm)
    assert abs(whole.pair_accuracy_after - micro.pair_accuracy_after) < 1e-9


def test_non_finite_gradient_skips_the_step(rm: VerifyRM) -> None:
    with torch.no_grad():
        rm.model.score.weight[0, 0] = float("nan")
    before = {name: p.detach().clone() for name, p in rm.model.named_parameters()}
    stats = rm.update(tiny_pairs(4))
    assert stats.skipped and stats.version == 0 and rm.version == 0
    assert not math.isfinite(stats.grad_norm)
    for name, p in rm.model.named_parameters():
        assert torch.equal(before[name], p) or torch.isnan(p).any(), name
    assert not rm.optimizer.state  # AdamW never stepped


def test_no_pairs_is_a_skipped_update(rm: VerifyRM) -> None:
    stats = rm.update([])
    assert stats.skipped and stats.version == 0


def test_pretrain_bce_learns_labels(rm: VerifyRM) -> None:
    triples = [LabelledTriple(p.question, p.reference, c, label)
               for p in tiny_pairs(2) for c, label in ((p.positive, True), (p.negative, False))]
    result = rm.pretrain(triples, epochs=60, lr=3e-3, batch_size=4)
    assert result["accuracy"] == 1.0
    assert result["loss"] < math.log(2)
    assert rm.version == 0


def test_onednn_linear_layers_score_as_torchs_and_train_the_same_weights(tiny_rm_dir: str) -> None:
    pairs = tiny_pairs(4)
    items = tiny_items(16)
    with_torch, with_onednn = (VerifyRM.load(tiny_rm_dir, OptimConfig(lr=3e-3, micro_batch_size=8), device="cpu")
                               for _ in range(2))
    with_onednn.use_linear_kernel("onednn")
    assert with_onednn.linear_kernel == "onednn"
    ran: list[int] = []  # scoring passes really go through oneDNN
    original = torch._C._nn.mkldnn_linear
    torch._C._nn.mkldnn_linear = lambda *args: ran.append(1) or original(*args)
    try:
        scores = with_onednn.score(items, batch_size=16)
    finally:
        torch._C._nn.mkldnn_linear = original
    assert len(ran) == sum(isinstance(m, torch.nn.Linear) for m in with_onednn.model.modules())
    reference = with_torch.score(items, batch_size=16)
    assert max(abs(a[1] - b[1]) for a, b in zip(scores, reference, strict=True)) <= 1e-5
    # Training passes run torch's kernel whatever scoring runs: the same update makes the same weights, bit for bit.
    stats = [rm.update(pairs) for rm in (with_torch, with_onednn)]
    assert stats[0].loss == stats[1].loss and stats[0].grad_norm == stats[1].grad_norm
    for a, b in zip(with_torch.model.parameters(), with_onednn.model.parameters(), strict=True):
        assert torch.equal(a, b)
    with_onednn.use_linear_kernel("torch")  # and back: the layers' own forward again
    assert all("forward" not in m.__dict__ for m in with_onednn.model.modules())
    assert with_onednn.score(items, batch_size=16) == with_torch.score(items, batch_size=16)


def test_the_linear_kernel_is_chosen_by_timing_and_only_for_float32_on_a_cpu(tiny_rm_dir: str) -> None:
    rm = VerifyRM.load(tiny_rm_dir, OptimConfig(), device="cpu", dtype="float32")
    kernel, why = rm.choose_linear_kernel(32)
    assert rm.linear_kernel == kernel and kernel in ("torch", "onednn") and "oneDNN" in why
    bf16 = VerifyRM.load(tiny_rm_dir, OptimConfig(), device="cpu", dtype="bfloat16", trains=False)
    assert bf16.choose_linear_kernel(32) == ("torch", "not a float32 model on a CPU")
    bf16.use_linear_kernel("onednn")  # asked for, but it would not apply: torch's stays
    assert bf16.linear_kernel == "torch" and all("forward" not in m.__dict__ for m in bf16.model.modules())
