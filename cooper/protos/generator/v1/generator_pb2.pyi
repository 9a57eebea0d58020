from collections.abc import Iterable as _Iterable
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper

DESCRIPTOR: _descriptor.FileDescriptor

class Judgment(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JUDGMENT_UNSPECIFIED: _ClassVar[Judgment]
    YES: _ClassVar[Judgment]
    NO: _ClassVar[Judgment]
    UNKNOWN: _ClassVar[Judgment]
JUDGMENT_UNSPECIFIED: Judgment
YES: Judgment
NO: Judgment
UNKNOWN: Judgment

class NegativeItem(_message.Message):
    __slots__ = ("id", "question", "reference", "positive")
    ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    POSITIVE_FIELD_NUMBER: _ClassVar[int]
    id: str
    question: str
    reference: str
    positive: str
    def __init__(self, id: str | None = ..., question: str | None = ..., reference: str | None = ..., positive: str | None = ...) -> None: ...

class NegativesRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[NegativeItem]
    def __init__(self, items: _Iterable[NegativeItem | _Mapping] | None = ...) -> None: ...

class NegativeResult(_message.Message):
    __slots__ = ("id", "negative", "attempts", "valid", "reason", "rejections")
    ID_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    VALID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    id: str
    negative: str
    attempts: int
    valid: bool
    reason: str
    rejections: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: str | None = ..., negative: str | None = ..., attempts: int | None = ..., valid: bool = ..., reason: str | None = ..., rejections: _Iterable[str] | None = ...) -> None: ...

class NegativesResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[NegativeResult]
    def __init__(self, results: _Iterable[NegativeResult | _Mapping] | None = ...) -> None: ...

class JudgeItem(_message.Message):
    __slots__ = ("question", "reference", "completion")
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    question: str
    reference: str
    completion: str
    def __init__(self, question: str | None = ..., reference: str | None = ..., completion: str | None = ...) -> None: ...

class JudgeRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[JudgeItem]
    def __init__(self, items: _Iterable[JudgeItem | _Mapping] | None = ...) -> None: ...

class JudgeResult(_message.Message):
    __slots__ = ("verdict", "raw")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    verdict: Judgment
    raw: str
    def __init__(self, verdict: Judgment | str | None = ..., raw: str | None = ...) -> None: ...

class JudgeResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[JudgeResult]
    def __init__(self, results: _Iterable[JudgeResult | _Mapping] | None = ...) -> None: ...
