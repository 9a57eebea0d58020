from cooper.protos.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreItem(_message.Message):
    __slots__ = ("question", "reference", "completion")
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    question: str
    reference: str
    completion: str
    def __init__(self, question: _Optional[str] = ..., reference: _Optional[str] = ..., completion: _Optional[str] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ScoreItem]
    def __init__(self, items: _Optional[_Iterable[_Union[ScoreItem, _Mapping]]] = ...) -> None: ...

class Score(_message.Message):
    __slots__ = ("score", "logit")
    SCORE_FIELD_NUMBER: _ClassVar[int]
    LOGIT_FIELD_NUMBER: _ClassVar[int]
    score: float
    logit: float
    def __init__(self, score: _Optional[float] = ..., logit: _Optional[float] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores", "version")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[Score]
    version: int
    def __init__(self, scores: _Optional[_Iterable[_Union[Score, _Mapping]]] = ..., version: _Optional[int] = ...) -> None: ...

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
    def __init__(self, question: _Optional[str] = ..., reference: _Optional[str] = ..., positive: _Optional[str] = ..., negative: _Optional[str] = ...) -> None: ...

class UpdateRequest(_message.Message):
    __slots__ = ("key", "pairs", "optimizer_steps")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_STEPS_FIELD_NUMBER: _ClassVar[int]
    key: _common_pb2.IdempotencyKey
    pairs: _containers.RepeatedCompositeFieldContainer[Pair]
    optimizer_steps: int
    def __init__(self, key: _Optional[_Union[_common_pb2.IdempotencyKey, _Mapping]] = ..., pairs: _Optional[_Iterable[_Union[Pair, _Mapping]]] = ..., optimizer_steps: _Optional[int] = ...) -> None: ...

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
    def __init__(self, loss: _Optional[float] = ..., grad_norm: _Optional[float] = ..., pair_accuracy_before: _Optional[float] = ..., pair_accuracy_after: _Optional[float] = ..., version: _Optional[int] = ..., skipped: bool = ..., replayed: bool = ...) -> None: ...

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
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., parameters: _Optional[int] = ..., device: _Optional[str] = ..., last_key: _Optional[str] = ..., checkpoint: _Optional[str] = ...) -> None: ...
