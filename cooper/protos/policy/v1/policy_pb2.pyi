from collections.abc import Iterable as _Iterable
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf.internal import containers as _containers

from cooper.protos.common.v1 import common_pb2 as _common_pb2

DESCRIPTOR: _descriptor.FileDescriptor

class Prompt(_message.Message):
    __slots__ = ("id", "text")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    id: str
    text: str
    def __init__(self, id: str | None = ..., text: str | None = ...) -> None: ...

class Sampling(_message.Message):
    __slots__ = ("n", "temperature", "top_p", "max_new_tokens", "stop", "seed")
    N_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    n: int
    temperature: float
    top_p: float
    max_new_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    seed: int
    def __init__(self, n: int | None = ..., temperature: float | None = ..., top_p: float | None = ..., max_new_tokens: int | None = ..., stop: _Iterable[str] | None = ..., seed: int | None = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompts", "sampling")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[Prompt]
    sampling: Sampling
    def __init__(self, prompts: _Iterable[Prompt | _Mapping] | None = ..., sampling: Sampling | _Mapping | None = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("prompt_id", "index", "text", "token_ids", "logprobs", "finish_reason", "prompt_token_ids")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    index: int
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, prompt_id: str | None = ..., index: int | None = ..., text: str | None = ..., token_ids: _Iterable[int] | None = ..., logprobs: _Iterable[float] | None = ..., finish_reason: str | None = ..., prompt_token_ids: _Iterable[int] | None = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("completions", "version")
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    version: int
    def __init__(self, completions: _Iterable[Completion | _Mapping] | None = ..., version: int | None = ...) -> None: ...

class TrainRequest(_message.Message):
    __slots__ = ("key", "rollout", "rewards", "group_size")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    key: _common_pb2.IdempotencyKey
    rollout: _containers.RepeatedCompositeFieldContainer[Completion]
    rewards: _containers.RepeatedScalarFieldContainer[float]
    group_size: int
    def __init__(self, key: _common_pb2.IdempotencyKey | _Mapping | None = ..., rollout: _Iterable[Completion | _Mapping] | None = ..., rewards: _Iterable[float] | None = ..., group_size: int | None = ...) -> None: ...

class TrainResponse(_message.Message):
    __slots__ = ("metrics", "version", "replayed")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: str | None = ..., value: float | None = ...) -> None: ...
    METRICS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    metrics: _containers.ScalarMap[str, float]
    version: int
    replayed: bool
    def __init__(self, metrics: _Mapping[str, float] | None = ..., version: int | None = ..., replayed: bool = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model", "version", "parameters", "device", "engine", "last_key", "checkpoint")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    LAST_KEY_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    parameters: int
    device: str
    engine: str
    last_key: str
    checkpoint: str
    def __init__(self, model: str | None = ..., version: int | None = ..., parameters: int | None = ..., device: str | None = ..., engine: str | None = ..., last_key: str | None = ..., checkpoint: str | None = ...) -> None: ...
