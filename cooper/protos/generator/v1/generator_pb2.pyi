from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

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
    def __init__(self, id: _Optional[str] = ..., question: _Optional[str] = ..., reference: _Optional[str] = ..., positive: _Optional[str] = ...) -> None: ...

class NegativesRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[NegativeItem]
    def __init__(self, items: _Optional[_Iterable[_Union[NegativeItem, _Mapping]]] = ...) -> None: ...

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
    def __init__(self, id: _Optional[str] = ..., negative: _Optional[str] = ..., attempts: _Optional[int] = ..., valid: bool = ..., reason: _Optional[str] = ..., rejections: _Optional[_Iterable[str]] = ...) -> None: ...

class NegativesResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[NegativeResult]
    def __init__(self, results: _Optional[_Iterable[_Union[NegativeResult, _Mapping]]] = ...) -> None: ...

class JudgeItem(_message.Message):
    __slots__ = ("question", "reference", "completion")
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    question: str
    reference: str
    completion: str
    def __init__(self, question: _Optional[str] = ..., reference: _Optional[str] = ..., completion: _Optional[str] = ...) -> None: ...

class JudgeRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[JudgeItem]
    def __init__(self, items: _Optional[_Iterable[_Union[JudgeItem, _Mapping]]] = ...) -> None: ...

class JudgeResult(_message.Message):
    __slots__ = ("verdict", "raw")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    verdict: Judgment
    raw: str
    def __init__(self, verdict: _Optional[_Union[Judgment, str]] = ..., raw: _Optional[str] = ...) -> None: ...

class JudgeResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[JudgeResult]
    def __init__(self, results: _Optional[_Iterable[_Union[JudgeResult, _Mapping]]] = ...) -> None: ...
