"""The reward-hacking alarm as the driver runs it: one observation per logged step, its events written down.

The detector (cooper/evaluation/alarm.py) is pure; this keeps its state in the run's Redis state (so a resumed run
goes on with the same baseline and sums: `RunState.alarm_memory`), adds `alarm/*` keys to each step's metrics record,
appends every raise and clear to `alarms.jsonl` with the step and the policy's and reward model's versions, and, in
act mode, writes the orders the stages read (`RunState.alarm_orders`): the actions in force while the alarm is up,
and with the rollback action, at each raise, a rollback request (which policy_update takes once:
stages.rollback_policy).

The onset of a raise is the last step at which every CUSUM statistic was 0 (or the baseline's last step): the sums
start climbing after it, so the policy version that sampled it is the newest one not yet drifting.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
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
from cooper.orchestrator.run_store import AlarmMemory, AlarmOrders, RollbackRequest, RunState

log = logging.getLogger("cooper.orchestrator")

EVENTS_FILE = "alarms.jsonl"


def applies(action: str, mode: str) -> bool:
    """Whether an alarm action can act in a reward mode: rm_negatives changes VerifyRM's updates, which only a mode
    whose reward model learns makes."""
    return action != "rm_negatives" or reward_mode(mode).reward_model_learns


def acts(config: CooperConfig) -> bool:
    """Whether the alarm can take actions in this run: act mode, in a mode it watches (rule mode has no reward model)."""
    return config.alarm.mode == "act" and reward_mode(config.run.mode).reward_model_scores


def alarm_orders(config: CooperConfig, store: RunState) -> AlarmOrders:
    """What the alarm asks of the stages now: nothing unless it acts (act mode, in a mode it watches)."""
    return store.alarm_orders() if acts(config) else AlarmOrders()


class AlarmWatch:
    def __init__(self, config: CooperConfig, store: RunState, run_dir: Path):
        alarm = config.alarm
        self.acting = alarm.mode == "act"
        self.actions: list[str] = [a for a in alarm.actions if applies(a, config.run.mode)] if self.acting else []
        if skipped := [a for a in alarm.actions if self.acting and not applies(a, config.run.mode)]:
            log.info("alarm action(s) %s do nothing in %s mode (its reward model never trains); not taken",
                     ", ".join(skipped), config.run.mode)
        self.settings = AlarmSettings(baseline_steps=alarm.baseline_steps, drift=alarm.drift,
                                      false_alarm_rate=alarm.false_alarm_rate, run_steps=config.run.steps,
                                      clear_steps=alarm.clear_steps, fixed_threshold=alarm.threshold,
                                      false_positive_margin=alarm.false_positive_margin,
                                      false_positive_bound=alarm.false_positive_bound)
        self.store, self.events, self.latch = store, run_dir / EVENTS_FILE, alarm.latch
        self.on_event: Callable[[dict[str, Any]], None] | None = None  # also told of every raise and clear
        self.escalate_after = alarm.escalate_after
        memory = store.alarm_memory()  # a resumed run goes on where the last driver left off
        self.latched, self.raises, self.raised_step = memory.latched, memory.raises, memory.raised_step
        self.onset: dict[str, int] = dict(memory.onset or {})  # the newest step with every statistic at 0
        self.level = memory.level  # how many of `actions`, in order, are in force
        self.rolled_back = memory.rolled_back  # the raise whose rollback was requested last
        self.alarm = (HackingAlarm.from_state(self.settings, memory.detector) if memory.detector
                      else HackingAlarm(self.settings))

    @classmethod
    def for_run(cls, config: CooperConfig, store: RunState, run_dir: Path) -> AlarmWatch | None:
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
            if self.on_event is not None:
                self.on_event(event)
            if observation.raised:
                log.warning("reward-hacking alarm raised at step %d (%s, statistic %.1f > %.1f)%s", step,
                            observation.trigger, fields[ALARM_STATISTIC], observation.threshold,
                            f": acting ({', '.join(self.actions)})" if self.actions else " (warn only)")
            else:
                log.warning("reward-hacking alarm cleared at step %d", step)
            fields[ALARM_EVENT] = event["event"]
        in_force: list[str] | None = None
        rollback: RollbackRequest | None = None
        if self.acting:
            if self.latch and observation.raised and not self.latched:
                self.latched = True
                log.warning("alarm.latch: its actions stay in force for the rest of the run")
            in_force = self._in_force(step)
            if "rollback" in in_force and self.rolled_back < self.raises:
                self.rolled_back = self.raises
                rollback = RollbackRequest(self.raises, self.onset.get("policy_version", 0))
                log.warning("alarm: rolling the policy back to its newest checkpoint at or below version %d "
                            "(onset: step %s)", rollback.at_most_version, self.onset.get("step"))
        self.store.set_alarm(AlarmMemory(self.alarm.state_dict(), self.latched, self.raises, self.raised_step,
                                         self.onset, self.level, self.rolled_back), in_force, rollback)
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
