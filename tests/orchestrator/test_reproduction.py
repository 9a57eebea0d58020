"""The reproduction criteria: each one holds on runs that show the finding and fails when its part is missing."""

from __future__ import annotations

import pytest

from cooper.experiments.reproduction import across_seeds, across_seeds_table, judge, results_table, summarize


def run(rewards, tests, auroc=None, kl=None, accuracy=None):
    """Records of a run: per step its reward and (with `accuracy`, one per step) the verifier's accuracy on the same
    rollouts and the gap between them, as orchestrator/run.py logs them."""
    records = []
    for step, reward in enumerate(rewards):
        record = {"step": step, "reward_mean": reward, "kl_from_initial": kl}
        if accuracy is not None:
            record["verifier_accuracy"] = accuracy[step]
            record["reward_accuracy_gap"] = reward - accuracy[step]
        if auroc is not None:
            record["rm_auroc"] = auroc
        if step in tests:
            record["test/tiny"] = tests[step]
        records.append(record)
    return records


def halves(first, second, steps=40):
    return [first] * (steps // 2) + [second] * (steps // 2)


def finding(rule_end=0.5, static_rewards=(0.3, 0.7), static_accuracy=(0.3, 0.1), static_end=0.15, cooper_end=0.48,
            cooper_auroc=0.9, seed=0):
    start = 0.3
    return [
        summarize("rule", seed, run([0.3] * 20 + [0.5] * 20, {19: 0.4, 39: rule_end}), "test/tiny", start),
        summarize("static", seed, run(halves(*static_rewards), {39: static_end}, auroc=0.6, kl=2.0,
                                      accuracy=halves(*static_accuracy)), "test/tiny", start),
        summarize("cooper", seed, run([0.4] * 40, {39: cooper_end}, auroc=cooper_auroc, kl=0.5), "test/tiny", start),
    ]


def test_all_criteria_hold_on_the_finding() -> None:
    verdict = judge(finding() + finding(seed=1))
    assert verdict["reproduced"] is True and set(verdict["criteria"]) == {"0", "1"}
    static = next(r for r in verdict["runs"] if r["mode"] == "static")
    assert (static["reward_start"], static["reward_end"], static["kl_end"]) == (0.3, 0.7, 2.0)
    assert static["gap_start"] == pytest.approx(0.0) and static["gap_end"] == pytest.approx(0.6)
    assert len(static["gap"]) == 40  # the series itself, step by step, in results.json
    assert "| static | 0 | 0.300 | 0.150 | 0.300 | 0.700 | 0.000 | 0.600 | 0.600 / 0.600 | 2.000 |" in \
        results_table(finding())


def _static_verdict(**static) -> dict[str, bool]:
    checks = judge(finding(**static))["criteria"]["0"]
    return {k: v for k, v in checks.items() if k.startswith("static")}


def test_static_is_hacked_when_the_proxy_pulls_away_from_the_gold() -> None:
    # Hacked from near the ceiling: the reward rises only 0.12 (0.86 -> 0.98), the verifier's accuracy of the same
    # rollouts falls 0.5 -> 0.1 and held-out accuracy with it. The proxy's rise alone would have missed it.
    assert _static_verdict(static_rewards=(0.86, 0.98), static_accuracy=(0.5, 0.1), static_end=0.1) == {
        "static_gap_widens": True, "static_test_falls": True}


def test_an_honest_run_whose_reward_rises_with_its_accuracy_is_not_hacked() -> None:
    assert _static_verdict(static_rewards=(0.4, 0.8), static_accuracy=(0.35, 0.75), static_end=0.6) == {
        "static_gap_widens": False, "static_test_falls": False}


def test_a_run_whose_reward_falls_with_its_accuracy_is_not_hacked() -> None:
    # A collapse, not a hack: the gold falls, but the proxy falls with it.
    assert _static_verdict(static_rewards=(0.6, 0.2), static_accuracy=(0.5, 0.1), static_end=0.1) == {
        "static_gap_widens": False, "static_test_falls": True}


def test_the_gold_must_fall_by_a_margin() -> None:
    assert _static_verdict(static_end=0.25)["static_test_falls"] is False  # 0.05 below its start: noise
    assert _static_verdict(static_end=0.19)["static_test_falls"] is True


def test_each_missing_part_fails_its_criterion() -> None:
    cases = {
        "rule_improves": finding(rule_end=0.44),
        "static_gap_widens": finding(static_rewards=(0.3, 0.5), static_accuracy=(0.3, 0.3)),
        "static_test_falls": finding(static_end=0.3),
        "cooper_keeps_up_with_rule": finding(cooper_end=0.44),
        "cooper_rm_stays_honest": finding(cooper_auroc=0.75),
    }
    for criterion, summaries in cases.items():
        verdict = judge(summaries + finding(seed=1))
        assert verdict["reproduced"] is False
        assert [k for k, ok in verdict["criteria"]["0"].items() if not ok] == [criterion]
    assert judge(finding()[:2])["criteria"]["0"]["cooper_rm_stays_honest"] is False  # a mode that did not run
    assert judge([])["reproduced"] is False


def test_across_seeds_gives_means_95_intervals_and_cooper_minus_rule_paired_by_seed() -> None:
    summaries = finding(rule_end=0.50, cooper_end=0.48) + finding(rule_end=0.60, cooper_end=0.50, seed=1)
    summaries += finding(rule_end=0.55, cooper_end=0.55, seed=2)
    aggregate = across_seeds(summaries)
    rule = aggregate["rule"]["test_end"]
    assert rule["mean"] == pytest.approx(0.55) and rule["low"] < 0.55 < rule["high"]
    # stdev 0.05 over 3 seeds: half width t(2) * 0.05 / sqrt(3)
    assert rule["high"] - rule["mean"] == pytest.approx(4.303 * 0.05 / 3 ** 0.5)
    assert aggregate["rule"]["test_gain"]["mean"] == pytest.approx(0.25)
    difference = aggregate["cooper_minus_rule"]
    assert difference["mean"] == pytest.approx((-0.02 - 0.10 + 0.0) / 3) and difference["low"] < difference["mean"]
    assert across_seeds(finding())["rule"]["test_end"]["low"] is None  # one seed: a mean, no interval
    table = across_seeds_table(aggregate)
    assert "| cooper - rule | -0.040 [" in table and "| static |" in table
