from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    CORRECT: _ClassVar[Verdict]
    INCORRECT: _ClassVar[Verdict]
    NO_ANSWER: _ClassVar[Verdict]
    TIMEOUT: _ClassVar[Verdict]
    ERROR: _ClassVar[Verdict]
VERDICT_UNSPECIFIED: Verdict
CORRECT: Verdict
INCORRECT: Verdict
NO_ANSWER: Verdict
TIMEOUT: Verdict
ERROR: Verdict

class VerifyItem(_message.Message):
    __slots__ = ("id", "completion", "reference")
    ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    id: str
    completion: str
    reference: str
    def __init__(self, id: _Optional[str] = ..., completion: _Optional[str] = ..., reference: _Optional[str] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[VerifyItem]
    def __init__(self, items: _Optional[_Iterable[_Union[VerifyItem, _Mapping]]] = ...) -> None: ...

class VerifyResult(_message.Message):
    __slots__ = ("id", "verdict", "extracted", "ms", "detail")
    ID_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    EXTRACTED_FIELD_NUMBER: _ClassVar[int]
    MS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    id: str
    verdict: Verdict
    extracted: str
    ms: float
    detail: str
    def __init__(self, id: _Optional[str] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., extracted: _Optional[str] = ..., ms: _Optional[float] = ..., detail: _Optional[str] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[VerifyResult]
    def __init__(self, results: _Optional[_Iterable[_Union[VerifyResult, _Mapping]]] = ...) -> None: ...
