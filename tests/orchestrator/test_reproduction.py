"""The reproduction criteria: each one holds on runs that show the finding and fails when its part is missing."""

from __future__ import annotations

import pytest

from cooper.orchestrator.reproduction import across_seeds, across_seeds_table, judge, results_table, summarize


def run(rewards, tests, auroc=None, kl=None):
    records = []
    for step, reward in enumerate(rewards):
        record = {"step": step, "reward_mean": reward, "kl_from_initial": kl}
        if auroc is not None:
            record["rm_auroc"] = auroc
        if step in tests:
            record["test/tiny"] = tests[step]
        records.append(record)
    return records


def finding(rule_end=0.5, static_rewards=(0.3, 0.7), static_end=0.2, cooper_end=0.48, cooper_auroc=0.9, seed=0):
    start = 0.3
    return [
        summarize("rule", seed, run([0.3] * 20 + [0.5] * 20, {19: 0.4, 39: rule_end}), "test/tiny", start),
        summarize("static", seed, run([static_rewards[0]] * 20 + [static_rewards[1]] * 20, {39: static_end},
                                      auroc=0.6, kl=2.0), "test/tiny", start),
        summarize("cooper", seed, run([0.4] * 40, {39: cooper_end}, auroc=cooper_auroc, kl=0.5), "test/tiny", start),
    ]


def test_all_criteria_hold_on_the_finding() -> None:
    verdict = judge(finding() + finding(seed=1))
    assert verdict["reproduced"] is True and set(verdict["criteria"]) == {"0", "1"}
    static = next(r for r in verdict["runs"] if r["mode"] == "static")
    assert (static["reward_start"], static["reward_end"], static["kl_end"]) == (0.3, 0.7, 2.0)
    assert "| static | 0 | 0.300 | 0.200 | 0.300 | 0.700 | 0.600 / 0.600 | 2.000 |" in results_table(finding())


def test_each_missing_part_fails_its_criterion() -> None:
    cases = {
        "rule_improves": finding(rule_end=0.44),
        "static_reward_climbs": finding(static_rewards=(0.3, 0.5)),
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
