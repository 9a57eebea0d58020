"""The reward-hacking alarm as the driver runs it: one observation per logged step, its events written down.

The detector (cooper/evaluation/alarm.py) is pure; this keeps its state in the run's Redis state (so a resumed run
goes on with the same baseline and sums), adds `alarm/*` keys to each step's metrics record, appends every raise
and clear to `alarms.jsonl` with the step and the policy's and reward model's versions, and, in act mode, sets the
run state the stages read: `alarm_active` while the alarm is up, and with the rollback action, at each raise,
`rollback_request` (which policy_update takes once: stages.rollback_policy).

The onset of a raise is the last step at which every CUSUM statistic was 0 (or the baseline's last step): the sums
start climbing after it, so the policy version that sampled it is the newest one not yet drifting.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cooper.config import CooperConfig
from cooper.evaluation.alarm import AlarmSettings, HackingAlarm
from cooper.metric_names import (
    ALARM_EVENT,
    ALARM_STATE,
    ALARM_STATISTIC,
    ALARM_THRESHOLD,
    POLICY_VERSION,
    POLICY_VERSION_SAMPLED,
    REWARD_VERSION,
    REWARD_VERSION_USED,
    STEP,
)
from cooper.modes import reward_mode
from cooper.orchestrator.run_store import RunStore

log = logging.getLogger("cooper.orchestrator")

STATE_KEY = "alarm"
LATCHED_KEY = "alarm_latched"  # with alarm.latch: the alarm has raised once, so its actions stay in force
ACTIVE_KEY = "alarm_active"  # in act mode: the actions in force while the alarm is up, [] when it is down
ACTING_KEY = "alarm_acting"  # the raises so far, the current one's step, its onset, how many actions are in force
ROLLBACK_KEY = "rollback_request"  # with the rollback action: {"raise": n, "at_most_version": v}, one per raise
ROLLBACK_DONE_KEY = "rollback_done"  # the raise whose rollback request policy_update took last
EVENTS_FILE = "alarms.jsonl"


def applies(action: str, mode: str) -> bool:
    """Whether an alarm action can act in a reward mode: rm_negatives changes VerifyRM's updates, which only a mode
    whose reward model learns makes."""
    return action != "rm_negatives" or reward_mode(mode).reward_model_learns


def acts(config: CooperConfig) -> bool:
    """Whether the alarm can take actions in this run: act mode, in a mode it watches (rule mode has no reward model)."""
    return config.alarm.mode == "act" and reward_mode(config.run.mode).reward_model_scores


@dataclass(frozen=True)
class RollbackRequest:
    """The rollback of one raise: restore the newest kept policy checkpoint at or below `at_most_version`."""

    raise_number: int
    at_most_version: int


@dataclass(frozen=True)
class AlarmOrders:
    """What the alarm asks of the stages now, from one read of the run state: all off unless it acts (act mode)."""

    verifier_reward: bool = False
    """The policy trains on the verifier's reward instead of VerifyRM's."""
    rm_negatives: bool = False
    """VerifyRM's update takes more optimizer steps, with the rollouts it overpaid as extra negatives."""
    rollback: RollbackRequest | None = None
    """The latest raise's rollback request (taken once: `rollback_done`)."""
    rollback_done: int = 0
    """The raise whose rollback policy_update took last."""

    @classmethod
    def read(cls, config: CooperConfig, store: RunStore) -> AlarmOrders:
        if not acts(config):
            return cls()
        state = store.state()
        active, request = set(state.get(ACTIVE_KEY, [])), state.get(ROLLBACK_KEY)
        return cls("verifier_reward" in active, "rm_negatives" in active,
                   RollbackRequest(request["raise"], request["at_most_version"]) if request else None,
                   int(state.get(ROLLBACK_DONE_KEY, 0)))

    @staticmethod
    def rolled_back(store: RunStore, request: RollbackRequest) -> None:
        """Record that policy_update took `request`, so that no later step takes it again."""
        store.set_state(**{ROLLBACK_DONE_KEY: request.raise_number})


class AlarmWatch:
    def __init__(self, config: CooperConfig, store: RunStore, run_dir: Path):
        alarm = config.alarm
        self.acting = alarm.mode == "act"
        self.actions = [a for a in alarm.actions if applies(a, config.run.mode)] if self.acting else []
        if skipped := [a for a in alarm.actions if self.acting and not applies(a, config.run.mode)]:
            log.info("alarm action(s) %s do nothing in %s mode (its reward model never trains); not taken",
                     ", ".join(skipped), config.run.mode)
        self.settings = AlarmSettings(baseline_steps=alarm.baseline_steps, drift=alarm.drift,
                                      false_alarm_rate=alarm.false_alarm_rate, run_steps=config.run.steps,
                                      clear_steps=alarm.clear_steps, fixed_threshold=alarm.threshold,
                                      false_positive_margin=alarm.false_positive_margin,
                                      false_positive_bound=alarm.false_positive_bound)
        self.store, self.events, self.latch = store, run_dir / EVENTS_FILE, alarm.latch
        state = store.state()
        self.latched = bool(state.get(LATCHED_KEY))
        self.escalate_after = alarm.escalate_after
        acting = state.get(ACTING_KEY, {})
        self.raises, self.raised_step = int(acting.get("raises", 0)), int(acting.get("raised_step", 0))
        self.onset: dict[str, int] = dict(acting.get("onset", {}))  # the newest step with every statistic at 0
        self.level = int(acting.get("level", 0))  # how many of `actions`, in order, are in force
        self.rolled_back = int(acting.get("rolled_back", 0))  # the raise whose rollback was requested last
        saved = state.get(STATE_KEY)
        self.alarm = HackingAlarm.from_state(self.settings, saved) if saved else HackingAlarm(self.settings)

    @classmethod
    def for_run(cls, config: CooperConfig, store: RunStore, run_dir: Path) -> AlarmWatch | None:
        """None when there is nothing to watch: alarm.mode off, rule mode (no reward model), or a run too short
        to fit a baseline and then watch."""
        if config.alarm.mode == "off" or not reward_mode(config.run.mode).reward_model_scores:
            return None
        if config.run.steps <= config.alarm.baseline_steps:
            log.info("reward-hacking alarm off: run.steps (%d) leaves no step after its %d-step baseline",
                     config.run.steps, config.alarm.baseline_steps)
            return None
        return cls(config, store, run_dir)

    def observe(self, record: dict[str, Any]) -> dict[str, Any]:
        """The `alarm/*` keys of a step's record; logs and acts on a raise or a clear."""
        step = record[STEP]
        seen = self.alarm.steps_seen
        if step < seen:  # a resumed run logs again the steps after its last logged one: seen once is enough
            return {}
        observation = self.alarm.observe(step, record)
        quiet = observation.state == "clear" and not any(observation.statistics.values())
        if observation.state == "baseline" or quiet:
            self.onset = {"step": step, "policy_version": int(record.get(POLICY_VERSION_SAMPLED, 0))}
        fields: dict[str, Any] = {ALARM_STATE: observation.state,
                                  ALARM_STATISTIC: max(observation.statistics.values(), default=0.0),
                                  ALARM_THRESHOLD: observation.threshold}
        if observation.raised:
            self.raises, self.raised_step = self.raises + 1, step
        if observation.raised or observation.cleared:
            event = {"step": step, "event": "raised" if observation.raised else "cleared",
                     "trigger": observation.trigger, "statistics": observation.statistics,
                     "threshold": observation.threshold, "policy_version": record.get(POLICY_VERSION),
                     "reward_version": record.get(REWARD_VERSION, record.get(REWARD_VERSION_USED)),
                     "actions": self.actions if observation.raised else []}
            if observation.raised:
                event["onset"] = self.onset
            with self.events.open("a") as out:
                out.write(json.dumps(event) + "\n")
            if observation.raised:
                log.warning("reward-hacking alarm raised at step %d (%s, statistic %.1f > %.1f)%s", step,
                            observation.trigger, fields[ALARM_STATISTIC], observation.threshold,
                            f": acting ({', '.join(self.actions)})" if self.actions else " (warn only)")
            else:
                log.warning("reward-hacking alarm cleared at step %d", step)
            fields[ALARM_EVENT] = event["event"]
        state: dict[str, Any] = {STATE_KEY: self.alarm.state_dict()}
        if self.acting:
            if self.latch and observation.raised and not self.latched:
                self.latched = state[LATCHED_KEY] = True
                log.warning("alarm.latch: its actions stay in force for the rest of the run")
            in_force = self._in_force(step)
            if "rollback" in in_force and self.rolled_back < self.raises:
                self.rolled_back = self.raises
                state[ROLLBACK_KEY] = {"raise": self.raises, "at_most_version": self.onset.get("policy_version", 0)}
                log.warning("alarm: rolling the policy back to its newest checkpoint at or below version %d "
                            "(onset: step %s)", state[ROLLBACK_KEY]["at_most_version"], self.onset.get("step"))
            state[ACTIVE_KEY] = in_force
        state[ACTING_KEY] = {"raises": self.raises, "raised_step": self.raised_step, "onset": self.onset,
                             "level": self.level, "rolled_back": self.rolled_back}
        self.store.set_state(**state)
        return fields

    def _in_force(self, step: int) -> list[str]:
        """The actions in force after this step: all of them while the alarm is up or, with alarm.escalate_after,
        the first one from the raise and one more every escalate_after steps it stays up; after it clears none, or
        with the latch the ones reached."""
        if self.alarm.alarmed:
            level = len(self.actions) if self.escalate_after is None else min(
                len(self.actions), 1 + (step - self.raised_step) // self.escalate_after)
            self.level = max(self.level, level) if self.latched else level
        elif not self.latched:
            self.level = 0
        return self.actions[: self.level]
