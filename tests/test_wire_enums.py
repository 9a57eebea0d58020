"""Every WireEnum equals its proto enum: the same names with the same numbers (the proto's zero left out)."""

from cooper.protos.generator.v1 import generator_pb2
from cooper.protos.verifier.v1 import verifier_pb2
from cooper.services.generator.messages import Judgment
from cooper.services.verifier.messages import Verdict


def test_wire_enums_equal_their_proto_enums():
    for ours, proto in [(Verdict, verifier_pb2.Verdict), (Judgment, generator_pb2.Judgment)]:
        assert {m.name: int(m) for m in ours} == {name: n for name, n in proto.items() if n != 0}
        assert [ours.Name(n) for n in proto.values() if n] == [proto.Name(n) for n in proto.values() if n]
        assert all(ours.Value(name) == proto.Value(name) for name, n in proto.items() if n)
