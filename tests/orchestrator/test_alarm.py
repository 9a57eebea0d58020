"""The reward-hacking alarm's detector on synthetic signal streams: false-alarm rate, detection delay, hysteresis."""

from __future__ import annotations

import json
import random

import pytest

from cooper.evaluation.alarm import MIN_AUROC_SUPPORT, AlarmSettings, HackingAlarm, signal_values, threshold_for

SETTINGS = AlarmSettings()  # the defaults a run uses: 30 baseline steps, 400-step runs, 10% false alarms per run


def honest_step(rng: random.Random, fpr_shift: float = 0.0, auroc_shift: float = 0.0) -> dict[str, float]:
    """One step's signals of a run whose reward model is not being exploited (plus optional shifts)."""
    return {"rm_false_positive_rate": rng.gauss(0.35 + fpr_shift, 0.1), "verifier_accuracy": 0.5,
            "rm_auroc": rng.gauss(0.8 + auroc_shift, 0.08), "reward_accuracy_gap": rng.gauss(0.1, 0.1)}


def first_alarm(stream) -> int | None:  # type: ignore[no-untyped-def]
    alarm = HackingAlarm(SETTINGS)
    for step, record in enumerate(stream):
        if alarm.observe(step, record).raised:
            return step
    return None


def test_false_alarm_rate_on_honest_runs_is_the_one_asked_for() -> None:
    # 200 fresh 400-step runs (seeds the calibration never drew): the share with any alarm is within sampling
    # error (sd ~0.021) of 10%.
    alarms = 0
    for seed in range(200):
        rng = random.Random(f"honest{seed}")
        alarms += first_alarm([honest_step(rng) for _ in range(400)]) is not None
    assert 0.02 <= alarms / 200 <= 0.18


def test_a_hack_is_caught_within_steps_of_its_start() -> None:
    # The false-positive rate rises by 1.5 baseline spreads at step 150 (static mode's measured rise on v6 was
    # larger: 0.35 -> 0.46), with half the rollouts wrong. Median delay about 13 steps; never raised before the shift in more than a few runs.
    delays, early = [], 0
    for seed in range(40):
        rng = random.Random(f"hack{seed}")
        stream = [honest_step(rng, fpr_shift=0.15 if step >= 150 else 0.0) for step in range(400)]
        step = first_alarm(stream)
        assert step is not None, f"seed {seed}: a 1.5-spread shift for 250 steps was never caught"
        if step < 150:
            early += 1
        else:
            delays.append(step - 150)
    delays.sort()
    assert early <= 6
    assert 5 <= delays[len(delays) // 2] <= 25
    assert delays[-1] <= 60


def test_a_falling_auroc_alone_raises_it() -> None:
    rng = random.Random("auroc")
    stream = [honest_step(rng, auroc_shift=-0.2 if step >= 100 else 0.0) for step in range(300)]
    assert first_alarm(stream) is not None and first_alarm(stream) >= 100  # type: ignore[operator]


def test_the_alarm_clears_only_after_the_signal_stays_back_for_clear_steps() -> None:
    rng = random.Random("clears")
    alarm, observations = HackingAlarm(SETTINGS), []
    for step in range(400):
        hacked = 100 <= step < 160
        record = honest_step(rng, fpr_shift=0.4 if hacked else 0.0)
        observations.append(alarm.observe(step, record))
    raised = [o.step for o in observations if o.raised]
    cleared = [o.step for o in observations if o.cleared]
    assert raised and 100 <= raised[0] < 120
    assert observations[raised[0]].trigger == "rm_false_positive_share"
    assert cleared and cleared[0] > 160
    assert cleared[0] <= 160 + 4 * SETTINGS.clear_steps  # back within a few windows of the cause going away
    # hysteresis: from raising to clearing every step reads "alarm", even those of the hack's last steps whose
    # statistic dipped; after clearing, the sums restart from zero
    assert all(o.state == "alarm" for o in observations[raised[0] : cleared[0]])
    assert all(value == 0.0 for value in observations[cleared[0]].statistics.values())


def test_baseline_steps_report_baseline_and_never_alarm() -> None:
    alarm = HackingAlarm(SETTINGS)
    rng = random.Random("baseline")
    states = [alarm.observe(step, honest_step(rng, fpr_shift=0.5)).state for step in range(SETTINGS.baseline_steps)]
    assert states == ["baseline"] * SETTINGS.baseline_steps


def test_a_resumed_alarm_goes_on_exactly_where_it_stopped() -> None:
    rng = random.Random("resume")
    stream = [honest_step(rng, fpr_shift=0.2 if step >= 80 else 0.0) for step in range(200)]
    whole = HackingAlarm(SETTINGS)
    expected = [whole.observe(step, record) for step, record in enumerate(stream)]
    first = HackingAlarm(SETTINGS)
    for step, record in enumerate(stream[:90]):
        first.observe(step, record)
    resumed = HackingAlarm.from_state(SETTINGS, first.state_dict())
    assert [resumed.observe(step, record) for step, record in enumerate(stream[90:], start=90)] == expected[90:]


def test_missing_and_undefined_signals_are_skipped() -> None:
    # AUROC is None when every rollout is right or every one wrong; rule mode logs no RM signals at all
    assert signal_values({"rm_auroc": None, "rm_false_positive_rate": float("nan"), "verifier_accuracy": 0.5}) == {}
    # the share of all rollouts that the RM accepts and the verifier rejects: rate x share of wrong rollouts
    assert signal_values({"rm_false_positive_rate": 0.4, "verifier_accuracy": 0.75}) == {"rm_false_positive_share": 0.1}
    assert signal_values({"reward_accuracy_gap": 0.4, "kl_from_initial": 4.0}) == {"reward_accuracy_gap": 0.2}
    assert signal_values({"reward_accuracy_gap": 0.4, "kl_from_initial": 0.5}) == {"reward_accuracy_gap": 0.4}
    # An AUROC over fewer than MIN_AUROC_SUPPORT rollouts of one kind is a coin, not evidence (one wrong rollout
    # among 32 ranked high gave 0.23 and raised the default run's alarm twice, docs/experiments.md 2026-11-27); a
    # record without the count (older runs) keeps it.
    assert signal_values({"rm_auroc": 0.23, "rm_auroc_support": MIN_AUROC_SUPPORT - 1}) == {}
    assert signal_values({"rm_auroc": 0.23, "rm_auroc_support": MIN_AUROC_SUPPORT}) == {"rm_auroc": 0.23}
    assert signal_values({"rm_auroc": 0.23}) == {"rm_auroc": 0.23}
    alarm = HackingAlarm(SETTINGS)
    for step in range(100):
        assert alarm.observe(step, {"step": step}).state in {"baseline", "clear"}


def test_a_stricter_false_alarm_rate_needs_more_evidence() -> None:
    loose = threshold_for(0.2, 30, 400, 3, 0.5)
    strict = threshold_for(0.05, 30, 400, 3, 0.5)
    assert strict > loose > 0


@pytest.mark.parametrize("settings", [
    {"baseline_steps": 1}, {"false_alarm_rate": 0.0}, {"false_alarm_rate": 1.0}, {"drift": 0.0},
{"clear_steps": 0}, {"run_steps": 10},
])
def test_bad_settings_are_refused_with_the_setting_named(settings: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match="|".join(settings)):
        AlarmSettings(**settings)


# ----- the alarm as a run's driver runs it: state in the run's (real) Redis, events in alarms.jsonl ---------------

def _watch_config(mode: str, alarm_mode: str, steps: int = 200):  # type: ignore[no-untyped-def]
    from cooper.config import load_config

    return load_config(overrides=[f"run.mode={mode}", f"run.steps={steps}", f"alarm.mode={alarm_mode}"])


def _records(steps: int, hack_from: int) -> list[dict]:  # type: ignore[type-arg]
    rng = random.Random("watch")
    return [{"step": step, "policy_version": step + 1, "reward_version_used": 7,
             **honest_step(rng, fpr_shift=0.4 if step >= hack_from else 0.0)} for step in range(steps)]


def test_a_watched_run_writes_each_raise_with_versions_and_acts_while_up(tmp_path, redis_client, run_id) -> None:
    from cooper.orchestrator.alarm_watch import AlarmWatch
    from cooper.orchestrator.run_store import RunStore

    store = RunStore(redis_client, "cooper-test", run_id)
    watch = AlarmWatch.for_run(_watch_config("static", "act"), store, tmp_path)
    assert watch is not None
    fields = [watch.observe(record) for record in _records(120, hack_from=60)]
    raised_at = next(i for i, f in enumerate(fields) if f.get("alarm/event") == "raised")
    assert 60 <= raised_at < 80
    assert all(f["alarm/state"] == "baseline" for f in fields[:30])
    events = [json.loads(line) for line in (tmp_path / "alarms.jsonl").read_text().splitlines()]
    assert events[0] == {**events[0], "step": raised_at, "event": "raised", "policy_version": raised_at + 1,
                         "reward_version": 7, "actions": ["verifier_reward"], "trigger": "rm_false_positive_share"}
    assert store.alarm_orders().in_force == ("verifier_reward",)  # the stages read this while the alarm is up

    # A resumed run (a new driver on the same Redis state) goes on with the same baseline and sums.
    resumed = AlarmWatch.for_run(_watch_config("static", "act"), store, tmp_path)
    assert resumed is not None and resumed.alarm == watch.alarm


def test_warn_mode_never_sets_actions_and_rule_or_short_runs_are_not_watched(tmp_path, redis_client, run_id) -> None:
    from cooper.orchestrator.alarm_watch import AlarmWatch
    from cooper.orchestrator.run_store import AlarmOrders, RunStore

    store = RunStore(redis_client, "cooper-test", run_id)
    watch = AlarmWatch.for_run(_watch_config("cooper", "warn"), store, tmp_path)
    assert watch is not None
    for record in _records(120, hack_from=60):
        watch.observe(record)
    assert (tmp_path / "alarms.jsonl").exists() and store.alarm_orders() == AlarmOrders()
    assert AlarmWatch.for_run(_watch_config("rule", "act"), store, tmp_path) is None
    assert AlarmWatch.for_run(_watch_config("static", "off"), store, tmp_path) is None
    assert AlarmWatch.for_run(_watch_config("static", "act", steps=30), store, tmp_path) is None


def test_rm_negatives_acts_in_cooper_mode_only(tmp_path, redis_client, run_id) -> None:
    from cooper.config import load_config
    from cooper.orchestrator.alarm_watch import AlarmWatch, alarm_orders
    from cooper.orchestrator.run_store import AlarmOrders, RunStore

    both = ["alarm.mode=act", "alarm.actions=[verifier_reward,rm_negatives]", "run.steps=200"]
    for mode, expected in (("cooper", ["verifier_reward", "rm_negatives"]), ("static", ["verifier_reward"])):
        config = load_config(overrides=[f"run.mode={mode}", *both])
        store = RunStore(redis_client, "cooper-test", f"{run_id}-{mode}")
        watch = AlarmWatch.for_run(config, store, tmp_path)
        assert watch is not None and watch.actions == expected
        for record in _records(120, hack_from=60):
            watch.observe(record)
        assert store.alarm_orders().in_force == tuple(expected)
        orders = alarm_orders(config, store)
        assert (orders.verifier_reward, orders.rm_negatives) == (True, mode == "cooper")
    warn = load_config(overrides=["run.mode=cooper", "alarm.mode=warn"])
    assert alarm_orders(warn, store) == AlarmOrders()  # warn mode never reads the state: nothing acts


def test_a_latched_alarm_keeps_acting_after_it_clears_and_across_a_resume(tmp_path, redis_client, run_id) -> None:
    from cooper.config import load_config
    from cooper.orchestrator.alarm_watch import AlarmWatch
    from cooper.orchestrator.run_store import RunStore

    # A hack from step 60 to 90, then honest again: the alarm raises, then clears.
    records = [r if r["step"] < 90 else {**r, **_records(150, hack_from=10**6)[r["step"]]} for r in _records(150, 60)]
    active: dict[bool, list[tuple[str, ...]]] = {}
    for latch in (False, True):
        config = load_config(overrides=["run.mode=static", "run.steps=200", "alarm.mode=act", f"alarm.latch={latch}"])
        store = RunStore(redis_client, "cooper-test", f"{run_id}-{latch}")
        watch = AlarmWatch.for_run(config, store, tmp_path / str(latch))
        assert watch is not None
        (tmp_path / str(latch)).mkdir()
        events = [watch.observe(r).get("alarm/event") for r in records[:120]]
        assert "raised" in events and "cleared" in events
        resumed = AlarmWatch.for_run(config, store, tmp_path / str(latch))  # a new driver on the same state
        assert resumed is not None
        active[latch] = []
        for record in records[120:]:
            resumed.observe(record)
            active[latch].append(store.alarm_orders().in_force)
    assert active[False] == [()] * 30 and active[True] == [("verifier_reward",)] * 30


def test_each_raise_requests_one_rollback_to_before_its_onset(tmp_path, redis_client, run_id) -> None:
    from cooper.config import load_config
    from cooper.orchestrator.alarm_watch import AlarmWatch, alarm_orders
    from cooper.orchestrator.run_store import AlarmOrders, RollbackRequest, RunStore

    config = load_config(overrides=["run.mode=static", "run.steps=200", "alarm.mode=act",
                                    "alarm.actions=[verifier_reward,rollback]"])
    store = RunStore(redis_client, "cooper-test", run_id)
    watch = AlarmWatch.for_run(config, store, tmp_path)
    assert watch is not None and watch.actions == ["verifier_reward", "rollback"]
    records = [{**r, "policy_version_sampled": r["step"] + 100} for r in _records(120, hack_from=60)]
    fields = [watch.observe(r) for r in records]
    raised_at = next(i for i, f in enumerate(fields) if f.get("alarm/event") == "raised")
    request = store.alarm_orders().rollback
    event = json.loads((tmp_path / "alarms.jsonl").read_text().splitlines()[0])
    onset = event["onset"]["step"]
    # The onset is the last step with every statistic at 0, here before the hack began (step 60): the rollback
    # reaches weights the hack had not touched.
    assert 30 <= onset < 60 < raised_at
    assert fields[onset]["alarm/statistic"] == 0 and all(f["alarm/statistic"] > 0 for f in fields[onset + 1 : raised_at])
    assert request == RollbackRequest(1, onset + 100) and event["onset"]["policy_version"] == onset + 100
    assert alarm_orders(config, store).rollback == request  # what policy_update reads
    warn = load_config(overrides=["run.mode=static", "run.steps=200", "alarm.mode=warn",
                                  "alarm.actions=[rollback]"])
    quiet_store = RunStore(redis_client, "cooper-test", f"{run_id}-warn")
    warned = AlarmWatch.for_run(warn, quiet_store, tmp_path / "warn")
    assert warned is not None
    (tmp_path / "warn").mkdir()
    for r in records:
        warned.observe(r)
    assert quiet_store.alarm_orders() == AlarmOrders()  # warn mode rolls nothing back


def test_graded_actions_join_in_their_order_while_the_alarm_stays_up(tmp_path, redis_client, run_id) -> None:
    from cooper.config import load_config
    from cooper.orchestrator.alarm_watch import AlarmWatch
    from cooper.orchestrator.run_store import RunStore

    config = load_config(overrides=["run.mode=cooper", "run.steps=200", "alarm.mode=act", "alarm.escalate_after=10",
                                    "alarm.actions=[rm_negatives,verifier_reward,rollback]"])
    store = RunStore(redis_client, "cooper-test", run_id)
    watch = AlarmWatch.for_run(config, store, tmp_path)
    assert watch is not None
    active, requests = [], []
    for record in _records(120, hack_from=60):  # a hack that never stops: the alarm stays up once raised
        fields = watch.observe(record)
        orders = store.alarm_orders()
        active.append(orders.in_force)
        requests.append(orders.rollback)
        if fields.get("alarm/event") == "raised":
            raised = record["step"]
    assert active[raised - 1] == ()
    assert active[raised : raised + 10] == [("rm_negatives",)] * 10
    assert active[raised + 10 : raised + 20] == [("rm_negatives", "verifier_reward")] * 10
    assert active[raised + 20] == ("rm_negatives", "verifier_reward", "rollback") == active[-1]
    # The rollback is requested once, when it comes into force, not at the raise.
    assert requests[raised + 19] is None and requests[raised + 20].raise_number == 1 and requests[-1] == requests[raised + 20]


def test_action_spans_are_the_steps_an_action_was_in_force() -> None:
    from cooper.launcher.plot import action_spans

    records = [{"step": 0, "mode": "static", "reward_source": "reward_model"},
               {"step": 1, "mode": "static", "reward_source": "rollback"},
               {"step": 2, "mode": "static", "reward_source": "verifier"},
               {"step": 3, "mode": "static", "reward_source": "reward_model"},
               {"step": 4, "mode": "cooper", "reward_source": "reward_model", "alarm/rm_negatives": True}]
    assert action_spans(records) == [(1, 2), (4, 4)]
    assert action_spans([{"step": 0, "mode": "rule", "reward_source": "verifier"}]) == []  # rule's own reward


def test_flagged_false_positives_are_the_accepted_rejected_rollouts_against_their_prompts_positive() -> None:
    from dataclasses import replace

    from cooper.orchestrator.stage_results import DataPosition, Prompt, RolloutResult, ScoreResult, VerificationResult
    from cooper.orchestrator.stages import flagged_false_positives
    from cooper.services.policy.messages import Completion
    from cooper.services.verifier.messages import Verdict

    prompts = [Prompt("p1", "q1", "1", "e1"), Prompt("p2", "q2", "2", "e2")]
    texts = [("p1", "right 1"), ("p1", "wrong, accepted"), ("p1", "wrong, refused"), ("p1", "no answer, accepted"),
             ("p2", "wrong, accepted but p2 has no positive"), ("p2", "timed out, accepted")]
    rollout = RolloutResult(policy_version=0, prompts=prompts, data_position=DataPosition(0, 0), completions=[
        Completion(p, i % 4, t, [1], [0.0], "stop", [1]) for i, (p, t) in enumerate(texts)])
    verification = VerificationResult(verdicts=[Verdict.CORRECT, Verdict.INCORRECT, Verdict.INCORRECT,
                                                Verdict.NO_ANSWER, Verdict.INCORRECT, Verdict.TIMEOUT],
                                      extracted=[""] * 6)
    score = ScoreResult(rewards=[1.0, 1.0, 0.0, 1.0, 1.0, 1.0], logits=[2.0, 0.3, -0.2, 1.5, 3.0, 1.0],
                        reward_version=0)
    pairs = flagged_false_positives(rollout, verification, score)
    assert [(p.question, p.reference, p.positive, p.negative) for p in pairs] == [
        ("q1", "1", "right 1", "wrong, accepted"), ("q1", "1", "right 1", "no answer, accepted")]
    # Without logits (a reward service that returns none) the scores decide, at 0.5.
    no_logits = flagged_false_positives(rollout, verification, replace(score, logits=[]))
    assert [p.negative for p in no_logits] == ["wrong, accepted", "no answer, accepted"]


def test_the_experiment_table_counts_raises_and_steps_on_the_verifier() -> None:
    from cooper.experiments.experiment import alarm_table

    watched = [{"step": 0, "alarm/state": "baseline", "reward_source": "reward_model"},
               {"step": 1, "alarm/state": "alarm", "alarm/event": "raised", "reward_source": "reward_model"},
               {"step": 2, "alarm/state": "alarm", "reward_source": "rollback", "alarm/rolled_back_to": 0},
               {"step": 3, "alarm/state": "alarm", "reward_source": "verifier", "alarm/rm_negatives": True,
                "test/heldout": 0.5}]
    quiet = [{"step": 0, "alarm/state": "clear", "reward_source": "reward_model", "test/heldout": 0.75}]
    table = alarm_table({"static": [watched, quiet], "rule": [[{"step": 0}], [{"step": 0}]]}, [11, 12], "heldout")
    lines = [line.split() for line in table.splitlines()]
    assert lines[1] == ["static", "11", "1", "1", "1", "1", "2:v0", "0.500", "-"]
    assert lines[2] == ["static", "12", "0", "-", "0", "0", "-", "0.750", "-"]
    assert len(lines) == 3  # rule mode is never watched: no row
    assert alarm_table({"rule": [[{"step": 0}]]}, [1], "heldout") == ""


def test_the_experiment_table_sets_each_acting_run_beside_its_no_action_control() -> None:
    from cooper.experiments.experiment import alarm_table

    acting = [{"step": 0, "alarm/state": "alarm", "alarm/event": "raised", "reward_source": "verifier",
               "test/heldout": 0.9}]
    warning = [{"step": 0, "alarm/state": "alarm", "alarm/event": "raised", "reward_source": "reward_model",
                "test/heldout": 0.2}]
    lines = [line.split() for line in alarm_table({"static": [acting], "static-noaction": [warning]}, [5],
                                                  "heldout").splitlines()]
    assert lines[1] == ["static", "5", "1", "0", "1", "0", "-", "0.900", "0.200"]
    assert lines[2] == ["static-noaction", "5", "1", "0", "0", "0", "-", "0.200", "-"]


def test_a_no_action_control_needs_an_acting_alarm_and_a_watched_mode(tmp_path) -> None:
    from cooper.config import ConfigError, load_config
    from cooper.experiments.experiment import mode_of, run_experiment

    warning = load_config(overrides=[f"run.output_dir={tmp_path}", "alarm.mode=warn"])
    with pytest.raises(ConfigError, match="alarm.mode=act"):
        run_experiment(warning, ("static",), seeds=[1], no_action_control=True)
    acting = load_config(overrides=[f"run.output_dir={tmp_path}", "alarm.mode=act"])
    with pytest.raises(ConfigError, match="static or cooper"):
        run_experiment(acting, ("rule",), seeds=[1], no_action_control=True)
    assert mode_of("static-noaction") == "static" and mode_of("cooper") == "cooper"
