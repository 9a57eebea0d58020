"""IntEnums that mirror proto enums, so that one class serves a service's pure core and its wire.

A generated enum wrapper (`verifier_pb2.Verdict`) is no Python enum: its members are plain ints, with no names of
their own. A WireEnum's members and values equal the proto enum's (its zero, *_UNSPECIFIED, left out: never sent),
so a member goes into a message as it is and a number from a message compares equal to it; tests/test_wire_enums.py
checks every WireEnum against its proto. The wrapper's `Name` and `Value` lookups are here too, so that code written
against the generated stubs reads the same.
"""

from __future__ import annotations

import enum


class WireEnum(enum.IntEnum):
    @classmethod
    def Name(cls, number: int) -> str:  # noqa: N802 (the generated wrappers' spelling)
        """The member name of `number` (ValueError when it has none)."""
        return cls(number).name

    @classmethod
    def Value(cls, name: str) -> int:  # noqa: N802
        """The number of member `name` (KeyError when there is none)."""
        return int(cls[name])
