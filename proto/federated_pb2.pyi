from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_WAIT: _ClassVar[TaskType]
    TASK_FIT: _ClassVar[TaskType]
    TASK_EVALUATE: _ClassVar[TaskType]
    TASK_DONE: _ClassVar[TaskType]
    TASK_SECURE_FIT: _ClassVar[TaskType]

class SecureStage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SECURE_STAGE_NONE: _ClassVar[SecureStage]
    SECURE_ADVERTISE_KEYS: _ClassVar[SecureStage]
    SECURE_SHARE_KEYS: _ClassVar[SecureStage]
    SECURE_MASKED_INPUT: _ClassVar[SecureStage]
    SECURE_UNMASK: _ClassVar[SecureStage]
    SECURE_READY: _ClassVar[SecureStage]

class Encoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENCODING_RAW: _ClassVar[Encoding]
    ENCODING_INT8: _ClassVar[Encoding]
    ENCODING_TOPK: _ClassVar[Encoding]
    ENCODING_TOPK_INT8: _ClassVar[Encoding]
TASK_WAIT: TaskType
TASK_FIT: TaskType
TASK_EVALUATE: TaskType
TASK_DONE: TaskType
TASK_SECURE_FIT: TaskType
SECURE_STAGE_NONE: SecureStage
SECURE_ADVERTISE_KEYS: SecureStage
SECURE_SHARE_KEYS: SecureStage
SECURE_MASKED_INPUT: SecureStage
SECURE_UNMASK: SecureStage
SECURE_READY: SecureStage
ENCODING_RAW: Encoding
ENCODING_INT8: Encoding
ENCODING_TOPK: Encoding
ENCODING_TOPK_INT8: Encoding

class RegisterRequest(_message.Message):
    __slots__ = ("client_name", "compression", "info")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    client_name: str
    compression: _containers.RepeatedScalarFieldContainer[str]
    info: _containers.ScalarMap[str, str]
    def __init__(self, client_name: _Optional[str] = ..., compression: _Optional[_Iterable[str]] = ..., info: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("client_id", "heartbeat_interval_ms")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    heartbeat_interval_ms: int
    def __init__(self, client_id: _Optional[str] = ..., heartbeat_interval_ms: _Optional[int] = ...) -> None: ...

class TaskRequest(_message.Message):
    __slots__ = ("client_id", "wait_ms", "send_model", "held_model_sha256")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    SEND_MODEL_FIELD_NUMBER: _ClassVar[int]
    HELD_MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    wait_ms: int
    send_model: bool
    held_model_sha256: str
    def __init__(self, client_id: _Optional[str] = ..., wait_ms: _Optional[int] = ..., send_model: _Optional[bool] = ..., held_model_sha256: _Optional[str] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("type", "round", "task_id", "model_version", "model_size", "model_sha256", "config_json", "retry_after_ms", "reason", "secure_stage", "secure_setup", "secure_payload", "model_crc32")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SECURE_STAGE_FIELD_NUMBER: _ClassVar[int]
    SECURE_SETUP_FIELD_NUMBER: _ClassVar[int]
    SECURE_PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    MODEL_CRC32_FIELD_NUMBER: _ClassVar[int]
    type: TaskType
    round: int
    task_id: str
    model_version: int
    model_size: int
    model_sha256: str
    config_json: str
    retry_after_ms: int
    reason: str
    secure_stage: SecureStage
    secure_setup: bytes
    secure_payload: bytes
    model_crc32: int
    def __init__(self, type: _Optional[_Union[TaskType, str]] = ..., round: _Optional[int] = ..., task_id: _Optional[str] = ..., model_version: _Optional[int] = ..., model_size: _Optional[int] = ..., model_sha256: _Optional[str] = ..., config_json: _Optional[str] = ..., retry_after_ms: _Optional[int] = ..., reason: _Optional[str] = ..., secure_stage: _Optional[_Union[SecureStage, str]] = ..., secure_setup: _Optional[bytes] = ..., secure_payload: _Optional[bytes] = ..., model_crc32: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("client_id", "task_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    task_id: str
    def __init__(self, client_id: _Optional[str] = ..., task_id: _Optional[str] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("task_active",)
    TASK_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    task_active: bool
    def __init__(self, task_active: _Optional[bool] = ...) -> None: ...

class DownloadRequest(_message.Message):
    __slots__ = ("client_id", "model_version", "offset", "chunk_size")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    model_version: int
    offset: int
    chunk_size: int
    def __init__(self, client_id: _Optional[str] = ..., model_version: _Optional[int] = ..., offset: _Optional[int] = ..., chunk_size: _Optional[int] = ...) -> None: ...

class ModelChunk(_message.Message):
    __slots__ = ("offset", "data", "total_size")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    total_size: int
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., total_size: _Optional[int] = ...) -> None: ...

class UploadHeader(_message.Message):
    __slots__ = ("client_id", "task_id", "upload_id", "total_size", "sha256", "num_samples", "metrics_json", "crc32", "then_poll_ms", "held_model_sha256")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    METRICS_JSON_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    THEN_POLL_MS_FIELD_NUMBER: _ClassVar[int]
    HELD_MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    task_id: str
    upload_id: str
    total_size: int
    sha256: str
    num_samples: int
    metrics_json: str
    crc32: int
    then_poll_ms: int
    held_model_sha256: str
    def __init__(self, client_id: _Optional[str] = ..., task_id: _Optional[str] = ..., upload_id: _Optional[str] = ..., total_size: _Optional[int] = ..., sha256: _Optional[str] = ..., num_samples: _Optional[int] = ..., metrics_json: _Optional[str] = ..., crc32: _Optional[int] = ..., then_poll_ms: _Optional[int] = ..., held_model_sha256: _Optional[str] = ...) -> None: ...

class UploadChunk(_message.Message):
    __slots__ = ("header", "offset", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: UploadHeader
    offset: int
    data: bytes
    def __init__(self, header: _Optional[_Union[UploadHeader, _Mapping]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadReply(_message.Message):
    __slots__ = ("accepted", "received", "message", "task_follows")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TASK_FOLLOWS_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    received: int
    message: str
    task_follows: bool
    def __init__(self, accepted: _Optional[bool] = ..., received: _Optional[int] = ..., message: _Optional[str] = ..., task_follows: _Optional[bool] = ...) -> None: ...

class UploadOffsetRequest(_message.Message):
    __slots__ = ("client_id", "upload_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    upload_id: str
    def __init__(self, client_id: _Optional[str] = ..., upload_id: _Optional[str] = ...) -> None: ...

class UploadOffsetReply(_message.Message):
    __slots__ = ("received",)
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    received: int
    def __init__(self, received: _Optional[int] = ...) -> None: ...

class EvaluationReport(_message.Message):
    __slots__ = ("client_id", "task_id", "loss", "num_samples", "metrics_json")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    METRICS_JSON_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    task_id: str
    loss: float
    num_samples: int
    metrics_json: str
    def __init__(self, client_id: _Optional[str] = ..., task_id: _Optional[str] = ..., loss: _Optional[float] = ..., num_samples: _Optional[int] = ..., metrics_json: _Optional[str] = ...) -> None: ...

class EvaluationReply(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...

class SecureHeader(_message.Message):
    __slots__ = ("client_id", "task_id", "stage", "total_size", "num_samples", "metrics_json", "withdraw")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    METRICS_JSON_FIELD_NUMBER: _ClassVar[int]
    WITHDRAW_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    task_id: str
    stage: SecureStage
    total_size: int
    num_samples: int
    metrics_json: str
    withdraw: bool
    def __init__(self, client_id: _Optional[str] = ..., task_id: _Optional[str] = ..., stage: _Optional[_Union[SecureStage, str]] = ..., total_size: _Optional[int] = ..., num_samples: _Optional[int] = ..., metrics_json: _Optional[str] = ..., withdraw: _Optional[bool] = ...) -> None: ...

class SecureChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: SecureHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[SecureHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class SecureReply(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("status_json",)
    STATUS_JSON_FIELD_NUMBER: _ClassVar[int]
    status_json: str
    def __init__(self, status_json: _Optional[str] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("poll", "download", "upload", "heartbeat")
    POLL_FIELD_NUMBER: _ClassVar[int]
    DOWNLOAD_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    poll: TaskRequest
    download: DownloadRequest
    upload: UploadChunk
    heartbeat: HeartbeatRequest
    def __init__(self, poll: _Optional[_Union[TaskRequest, _Mapping]] = ..., download: _Optional[_Union[DownloadRequest, _Mapping]] = ..., upload: _Optional[_Union[UploadChunk, _Mapping]] = ..., heartbeat: _Optional[_Union[HeartbeatRequest, _Mapping]] = ...) -> None: ...

class SessionReply(_message.Message):
    __slots__ = ("task", "model", "upload_offset", "upload_reply")
    TASK_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_OFFSET_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_REPLY_FIELD_NUMBER: _ClassVar[int]
    task: Task
    model: ModelChunk
    upload_offset: UploadOffsetReply
    upload_reply: UploadReply
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., model: _Optional[_Union[ModelChunk, _Mapping]] = ..., upload_offset: _Optional[_Union[UploadOffsetReply, _Mapping]] = ..., upload_reply: _Optional[_Union[UploadReply, _Mapping]] = ...) -> None: ...

class NamedTensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "encoding", "data", "scale", "indices")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    encoding: Encoding
    data: bytes
    scale: float
    indices: bytes
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., encoding: _Optional[_Union[Encoding, str]] = ..., data: _Optional[bytes] = ..., scale: _Optional[float] = ..., indices: _Optional[bytes] = ...) -> None: ...

class TensorBundle(_message.Message):
    __slots__ = ("tensors",)
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[NamedTensor]
    def __init__(self, tensors: _Optional[_Iterable[_Union[NamedTensor, _Mapping]]] = ...) -> None: ...
