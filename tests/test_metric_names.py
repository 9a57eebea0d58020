"""A step's metric names are defined once (cooper/metric_names.py): the readers find what a record built with those
names carries, so a name that drifts in one reader (a literal of its own) fails here."""

from __future__ import annotations

import pytest

from cooper import metric_names as names
from cooper.evaluation.alarm import FALSE_POSITIVE_SHARE, SIGNALS, AlarmSettings, HackingAlarm, signal_values
from cooper.evaluation.exploit_check import step_counts
from cooper.experiments.experiment import accuracy_points, alarm_table
from cooper.experiments.reproduction import summarize
from cooper.launcher.plot import action_spans
from cooper.metric_names import (
    ALARM_EVENT,
    ALARM_RM_NEGATIVES,
    ALARM_ROLLED_BACK_TO,
    ALARM_STATE,
    KL_FROM_INITIAL,
    MODE,
    REWARD_ACCURACY_GAP,
    REWARD_MEAN,
    REWARD_SOURCE,
    RM_AUROC,
    RM_AUROC_SUPPORT,
    RM_BENCH_INITIAL_FALSE_POSITIVE_RATE,
    RM_BENCH_INITIAL_NEGATIVES,
    RM_FALSE_POSITIVE_RATE,
    ROLLOUTS,
    STEP,
    TEST,
    TEST_INITIAL,
    VERIFIER_ACCURACY,
)

CONSTANTS = {name: value for name, value in vars(names).items() if name.isupper()}


def test_every_name_is_a_distinct_string():
    assert len(CONSTANTS) >= 30
    assert all(isinstance(value, str) and value for value in CONSTANTS.values())
    assert len(set(CONSTANTS.values())) == len(CONSTANTS), "two names share one key"


def test_prefixed_names_start_with_their_prefix():
    prefixes = {value for value in CONSTANTS.values() if value.endswith("/")}
    assert prefixes >= {names.TEST, names.TEST_INITIAL, names.RM_BENCH, names.RM_BENCH_INITIAL, names.POLICY,
                        names.TIME}
    assert names.RM_BENCH_ACCURACY.startswith(names.RM_BENCH)
    assert names.RM_BENCH_INITIAL_FALSE_POSITIVE_RATE.startswith(names.RM_BENCH_INITIAL)
    assert names.RM_BENCH_INITIAL_NEGATIVES.startswith(names.RM_BENCH_INITIAL)
    assert all(value.startswith("alarm/") for name, value in CONSTANTS.items() if name.startswith("ALARM_"))


def test_values_on_disk_are_unchanged():
    """metrics.jsonl files and the alarm's regression data carry these strings: a rename here is a format change."""
    assert (STEP, REWARD_MEAN, VERIFIER_ACCURACY, REWARD_ACCURACY_GAP, RM_AUROC, KL_FROM_INITIAL, ALARM_EVENT) == (
        "step", "reward_mean", "verifier_accuracy", "reward_accuracy_gap", "rm_auroc", "kl_from_initial",
        "alarm/event")


def test_the_alarm_signals_are_the_records_names():
    assert set(SIGNALS) - {FALSE_POSITIVE_SHARE} <= set(CONSTANTS.values())
    assert FALSE_POSITIVE_SHARE not in CONSTANTS.values()  # derived by the alarm, never in a record


def test_signal_values_reads_a_record_built_with_the_names():
    record = {RM_AUROC: 0.9, RM_AUROC_SUPPORT: 8, REWARD_ACCURACY_GAP: 0.2, RM_FALSE_POSITIVE_RATE: 0.5,
              VERIFIER_ACCURACY: 0.6, KL_FROM_INITIAL: 4.0}
    assert signal_values(record) == pytest.approx({RM_AUROC: 0.9, REWARD_ACCURACY_GAP: 0.1, FALSE_POSITIVE_SHARE: 0.2})
    # Each input counts, under its name: without KL the gap is not divided, with little support no AUROC, ...
    assert signal_values({**record, KL_FROM_INITIAL: None})[REWARD_ACCURACY_GAP] == pytest.approx(0.2)
    assert RM_AUROC not in signal_values({**record, RM_AUROC_SUPPORT: 1})
    assert FALSE_POSITIVE_SHARE not in signal_values({k: v for k, v in record.items() if k != VERIFIER_ACCURACY})
    assert FALSE_POSITIVE_SHARE not in signal_values({k: v for k, v in record.items() if k != RM_FALSE_POSITIVE_RATE})


def test_the_absolute_check_reads_the_names():
    record = {ROLLOUTS: 32, VERIFIER_ACCURACY: 0.75, RM_FALSE_POSITIVE_RATE: 0.5}
    assert step_counts(record) == (4, 8)
    alarm = HackingAlarm(AlarmSettings())
    alarm.observe(0, {STEP: 0, **record, RM_BENCH_INITIAL_FALSE_POSITIVE_RATE: 5 / 48, RM_BENCH_INITIAL_NEGATIVES: 48})
    assert alarm.bound is not None and 5 / 48 < alarm.bound < 1


def test_the_verdict_reads_the_names():
    records = [{STEP: step, REWARD_MEAN: 0.5, VERIFIER_ACCURACY: 0.4, REWARD_ACCURACY_GAP: 0.1, RM_AUROC: 0.8,
                KL_FROM_INITIAL: 2.0 + step, **({ALARM_EVENT: "raised"} if step == 3 else {}),
                **({TEST + "tiny": 0.6} if step == 7 else {})} for step in range(8)]
    summary = summarize("static", 0, records, TEST + "tiny", 0.3)
    assert (summary.test_end, summary.reward_end, summary.gap_end, summary.auroc_second_half, summary.kl_end,
            summary.alarm_raises) == (0.6, 0.5, pytest.approx(0.1), pytest.approx(0.8), 9.0, (3,))  # KL: the default


def test_the_experiment_tables_and_figures_read_the_names():
    records = [{STEP: 0, MODE: "static", REWARD_SOURCE: "reward_model", ALARM_STATE: "baseline",
                TEST_INITIAL + "tiny": 0.3},
               {STEP: 1, MODE: "static", REWARD_SOURCE: "verifier", ALARM_STATE: "alarm", ALARM_EVENT: "raised"},
               {STEP: 2, MODE: "static", REWARD_SOURCE: "rollback", ALARM_STATE: "alarm", ALARM_ROLLED_BACK_TO: 0},
               {STEP: 3, MODE: "static", REWARD_SOURCE: "reward_model", ALARM_STATE: "clear", ALARM_RM_NEGATIVES: True,
                TEST + "tiny": 0.5}]
    assert action_spans(records) == [(1, 3)]
    assert accuracy_points(records, "tiny") == [(0, 0.3), (4, 0.5)]
    row = alarm_table({"static": [records]}, [0], "tiny").splitlines()[1].split()
    assert row == ["static", "0", "1", "1", "1", "1", "2:v0", "0.500", "-"]
