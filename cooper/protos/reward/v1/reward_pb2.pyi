from collections.abc import Iterable as _Iterable
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf.internal import containers as _containers

from cooper.protos.common.v1 import common_pb2 as _common_pb2

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreItem(_message.Message):
    __slots__ = ("question", "reference", "completion")
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    question: str
    reference: str
    completion: str
    def __init__(self, question: str | None = ..., reference: str | None = ..., completion: str | None = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ScoreItem]
    def __init__(self, items: _Iterable[ScoreItem | _Mapping] | None = ...) -> None: ...

class Score(_message.Message):
    __slots__ = ("score", "logit")
    SCORE_FIELD_NUMBER: _ClassVar[int]
    LOGIT_FIELD_NUMBER: _ClassVar[int]
    score: float
    logit: float
    def __init__(self, score: float | None = ..., logit: float | None = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores", "version")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[Score]
    version: int
    def __init__(self, scores: _Iterable[Score | _Mapping] | None = ..., version: int | None = ...) -> None: ...

class Pair(_message.Message):
    __slots__ = ("question", "reference", "positive", "negative")
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    POSITIVE_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_FIELD_NUMBER: _ClassVar[int]
    question: str
    reference: str
    positive: str
    negative: str
    def __init__(self, question: str | None = ..., reference: str | None = ..., positive: str | None = ..., negative: str | None = ...) -> None: ...

class UpdateRequest(_message.Message):
    __slots__ = ("key", "pairs")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    key: _common_pb2.IdempotencyKey
    pairs: _containers.RepeatedCompositeFieldContainer[Pair]
    def __init__(self, key: _common_pb2.IdempotencyKey | _Mapping | None = ..., pairs: _Iterable[Pair | _Mapping] | None = ...) -> None: ...

class UpdateResponse(_message.Message):
    __slots__ = ("loss", "grad_norm", "pair_accuracy_before", "pair_accuracy_after", "version", "skipped", "replayed")
    LOSS_FIELD_NUMBER: _ClassVar[int]
    GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    PAIR_ACCURACY_BEFORE_FIELD_NUMBER: _ClassVar[int]
    PAIR_ACCURACY_AFTER_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    loss: float
    grad_norm: float
    pair_accuracy_before: float
    pair_accuracy_after: float
    version: int
    skipped: bool
    replayed: bool
    def __init__(self, loss: float | None = ..., grad_norm: float | None = ..., pair_accuracy_before: float | None = ..., pair_accuracy_after: float | None = ..., version: int | None = ..., skipped: bool = ..., replayed: bool = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model", "version", "parameters", "device", "last_key", "checkpoint")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    LAST_KEY_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    parameters: int
    device: str
    last_key: str
    checkpoint: str
    def __init__(self, model: str | None = ..., version: int | None = ..., parameters: int | None = ..., device: str | None = ..., last_key: str | None = ..., checkpoint: str | None = ...) -> None: ...
