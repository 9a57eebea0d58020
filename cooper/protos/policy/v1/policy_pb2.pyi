from cooper.protos.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Prompt(_message.Message):
    __slots__ = ("id", "text")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    id: str
    text: str
    def __init__(self, id: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

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
    def __init__(self, n: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., max_new_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompts", "sampling", "version")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[Prompt]
    sampling: Sampling
    version: int
    def __init__(self, prompts: _Optional[_Iterable[_Union[Prompt, _Mapping]]] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., version: _Optional[int] = ...) -> None: ...

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
    def __init__(self, prompt_id: _Optional[str] = ..., index: _Optional[int] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("completions", "version")
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    version: int
    def __init__(self, completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ..., version: _Optional[int] = ...) -> None: ...

class TrainRequest(_message.Message):
    __slots__ = ("key", "rollout", "rewards", "group_size", "sampled_version")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_VERSION_FIELD_NUMBER: _ClassVar[int]
    key: _common_pb2.IdempotencyKey
    rollout: _containers.RepeatedCompositeFieldContainer[Completion]
    rewards: _containers.RepeatedScalarFieldContainer[float]
    group_size: int
    sampled_version: int
    def __init__(self, key: _Optional[_Union[_common_pb2.IdempotencyKey, _Mapping]] = ..., rollout: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ..., rewards: _Optional[_Iterable[float]] = ..., group_size: _Optional[int] = ..., sampled_version: _Optional[int] = ...) -> None: ...

class TrainResponse(_message.Message):
    __slots__ = ("metrics", "version", "replayed")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    METRICS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    metrics: _containers.ScalarMap[str, float]
    version: int
    replayed: bool
    def __init__(self, metrics: _Optional[_Mapping[str, float]] = ..., version: _Optional[int] = ..., replayed: bool = ...) -> None: ...

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
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., parameters: _Optional[int] = ..., device: _Optional[str] = ..., engine: _Optional[str] = ..., last_key: _Optional[str] = ..., checkpoint: _Optional[str] = ...) -> None: ...

class RestoreRequest(_message.Message):
    __slots__ = ("key", "at_most_version")
    KEY_FIELD_NUMBER: _ClassVar[int]
    AT_MOST_VERSION_FIELD_NUMBER: _ClassVar[int]
    key: _common_pb2.IdempotencyKey
    at_most_version: int
    def __init__(self, key: _Optional[_Union[_common_pb2.IdempotencyKey, _Mapping]] = ..., at_most_version: _Optional[int] = ...) -> None: ...

class RestoreResponse(_message.Message):
    __slots__ = ("restored_version", "version", "checkpoint", "replayed")
    RESTORED_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    restored_version: int
    version: int
    checkpoint: str
    replayed: bool
    def __init__(self, restored_version: _Optional[int] = ..., version: _Optional[int] = ..., checkpoint: _Optional[str] = ..., replayed: bool = ...) -> None: ...
