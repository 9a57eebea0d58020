"""The idempotency ledger both trainers keep (cooper/runtime/ledger.py)."""

from cooper.runtime.ledger import Ledger, idempotency_key


def test_a_key_names_one_step_of_one_run_and_an_empty_run_id_none() -> None:
    assert idempotency_key("run-a", 3) == "run-a/3" != idempotency_key("run-b", 3)
    assert idempotency_key("", 3) == ""


def test_the_latest_keys_are_kept_and_a_keyless_update_is_not_recorded() -> None:
    ledger: Ledger[int] = Ledger(keep=2)
    for step in range(3):
        ledger.record(idempotency_key("run", step), step * 10)
    assert ledger.recorded("run/0") is None  # the oldest dropped
    assert (ledger.recorded("run/1"), ledger.recorded("run/2"), ledger.last_key) == (10, 20, "run/2")
    ledger.record("", 99)  # applied every time it is sent: nothing to answer a retry with
    assert ledger.last_key == "run/2" and ledger.recorded("") is None and list(ledger.results()) == ["run/1", "run/2"]
    # What a checkpoint saves brings the same ledger back.
    again = Ledger(2, ledger.results(), ledger.last_key)
    assert again.results() == ledger.results() and again.last_key == "run/2"
