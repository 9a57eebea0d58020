"""The alarm's regression data: real runs replayed give the raises they recorded (bench/alarm_replay.py).

bench/data/alarm-runs/ holds the runs of docs/experiments.md, "The alarm on real runs that set nothing", trimmed to
what the alarm reads and what it wrote at each step. Replaying them through the driver's AlarmWatch must give every
`alarm/*` field the runs wrote, at every step: a change to the detector that moves a raise, a statistic or a
threshold on real runs fails here, without retraining. A setting changed on the replay must show as runs not
reproduced, so the comparison cannot pass by comparing nothing.

The three runs acting with the absolute check on were recorded when it counted every wrong rollout as an independent
trial; it now bets per prompt (cooper/evaluation/exploit_check.py), and their records carry only each step's totals,
which it weighs as one bet a step. They replay to the raises pinned in COUNTED_PER_STEP, not to the ones they
recorded (steps 2-3).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "data" / "alarm-runs"
# run -> its raises replayed: a step of totals is one bet over all its rollouts, so the hack present from step 0 is
# found at 38-40 (41-45 when a prompt's share was its trial)
COUNTED_PER_STEP = {"static-tiny-rm-keyed-act-absolute-150steps-s621": [38],
                    "static-tiny-rm-keyed-act-absolute-150steps-s622": [39],
                    "static-tiny-rm-keyed-act-absolute-150steps-s623": [40]}


def replay(*overrides: str) -> dict:
    runs = sorted(str(path) for path in DATA.iterdir() if path.is_dir())
    completed = subprocess.run([sys.executable, str(ROOT / "bench" / "alarm_replay.py"), *runs, *overrides],
                               capture_output=True, text=True, timeout=240, check=True, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_the_recorded_runs_replay_to_the_raises_they_recorded() -> None:
    report = replay()
    runs = report["runs"]
    assert len(runs) == len([p for p in DATA.iterdir() if p.is_dir()]) >= 20
    for name, run in runs.items():
        assert run["steps"] == 150, name
        if name in COUNTED_PER_STEP:
            assert run["raises"] == COUNTED_PER_STEP[name] and not run["reproduced"], name
            continue
        assert run["raises"] == run["recorded_raises"], name
        assert run["reproduced"], f"{name}: the alarm's fields differ from step {run['first_differing_step']}"
    # Not vacuous: the hacked runs (static on the preset's keyed RM) raised.
    hacked = [run for name, run in runs.items() if name.startswith("static-tiny-rm-keyed-")]
    assert len(hacked) >= 9 and all(run["raises"] for run in hacked)


def test_a_changed_setting_is_seen_as_runs_not_reproduced() -> None:
    report = replay("alarm.drift=0.25")
    assert not report["reproduced"]
    assert sum(not run["reproduced"] for run in report["runs"].values()) == len(report["runs"])
