from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_DELIVERED: _ClassVar[Outcome]
    OUTCOME_FAILED: _ClassVar[Outcome]
    OUTCOME_REJECTED: _ClassVar[Outcome]

class Edge(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EDGE_UNSPECIFIED: _ClassVar[Edge]
    EDGE_EARLIEST: _ClassVar[Edge]
    EDGE_LATEST: _ClassVar[Edge]
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_DELIVERED: Outcome
OUTCOME_FAILED: Outcome
OUTCOME_REJECTED: Outcome
EDGE_UNSPECIFIED: Edge
EDGE_EARLIEST: Edge
EDGE_LATEST: Edge

class Message(_message.Message):
    __slots__ = ("destination", "body", "headers", "content_type")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    destination: str
    body: bytes
    headers: _containers.ScalarMap[str, str]
    content_type: str
    def __init__(self, destination: _Optional[str] = ..., body: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, str]] = ..., content_type: _Optional[str] = ...) -> None: ...

class Position(_message.Message):
    __slots__ = ("offset", "partition")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    offset: int
    partition: int
    def __init__(self, offset: _Optional[int] = ..., partition: _Optional[int] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ...) -> None: ...

class PublishResult(_message.Message):
    __slots__ = ("outcome", "reason", "positions", "code", "details")
    class PositionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Position
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Position, _Mapping]] = ...) -> None: ...
    class DetailsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    outcome: Outcome
    reason: str
    positions: _containers.MessageMap[str, Position]
    code: int
    details: _containers.ScalarMap[str, str]
    def __init__(self, outcome: _Optional[_Union[Outcome, str]] = ..., reason: _Optional[str] = ..., positions: _Optional[_Mapping[str, Position]] = ..., code: _Optional[int] = ..., details: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("outcome", "reason", "results")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    outcome: Outcome
    reason: str
    results: _containers.RepeatedCompositeFieldContainer[PublishResult]
    def __init__(self, outcome: _Optional[_Union[Outcome, str]] = ..., reason: _Optional[str] = ..., results: _Optional[_Iterable[_Union[PublishResult, _Mapping]]] = ...) -> None: ...

class Bound(_message.Message):
    __slots__ = ("edge", "position")
    EDGE_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    edge: Edge
    position: Position
    def __init__(self, edge: _Optional[_Union[Edge, str]] = ..., position: _Optional[_Union[Position, _Mapping]] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("destination", "group", "start", "end", "filter", "window")
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    destination: str
    group: str
    start: Bound
    end: Bound
    filter: str
    window: int
    def __init__(self, destination: _Optional[str] = ..., group: _Optional[str] = ..., start: _Optional[_Union[Bound, _Mapping]] = ..., end: _Optional[_Union[Bound, _Mapping]] = ..., filter: _Optional[str] = ..., window: _Optional[int] = ...) -> None: ...

class PeerIdentity(_message.Message):
    __slots__ = ("subject", "sans", "fingerprint")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    SANS_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    subject: str
    sans: _containers.RepeatedScalarFieldContainer[str]
    fingerprint: str
    def __init__(self, subject: _Optional[str] = ..., sans: _Optional[_Iterable[str]] = ..., fingerprint: _Optional[str] = ...) -> None: ...

class Source(_message.Message):
    __slots__ = ("protocol", "listener", "peer", "identity", "received_at", "upstream")
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    LISTENER_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    protocol: str
    listener: str
    peer: str
    identity: PeerIdentity
    received_at: float
    upstream: str
    def __init__(self, protocol: _Optional[str] = ..., listener: _Optional[str] = ..., peer: _Optional[str] = ..., identity: _Optional[_Union[PeerIdentity, _Mapping]] = ..., received_at: _Optional[float] = ..., upstream: _Optional[str] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("tag", "message", "redelivered", "position", "source", "call", "reply_within")
    TAG_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDELIVERED_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    REPLY_WITHIN_FIELD_NUMBER: _ClassVar[int]
    tag: int
    message: Message
    redelivered: bool
    position: Position
    source: Source
    call: bool
    reply_within: float
    def __init__(self, tag: _Optional[int] = ..., message: _Optional[_Union[Message, _Mapping]] = ..., redelivered: _Optional[bool] = ..., position: _Optional[_Union[Position, _Mapping]] = ..., source: _Optional[_Union[Source, _Mapping]] = ..., call: _Optional[bool] = ..., reply_within: _Optional[float] = ...) -> None: ...

class Nack(_message.Message):
    __slots__ = ("tag", "requeue", "reason")
    TAG_FIELD_NUMBER: _ClassVar[int]
    REQUEUE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tag: int
    requeue: bool
    reason: str
    def __init__(self, tag: _Optional[int] = ..., requeue: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class Reply(_message.Message):
    __slots__ = ("tag", "body", "headers", "content_type", "code", "message")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TAG_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    tag: int
    body: bytes
    headers: _containers.ScalarMap[str, str]
    content_type: str
    code: int
    message: str
    def __init__(self, tag: _Optional[int] = ..., body: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, str]] = ..., content_type: _Optional[str] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ConsumeRequest(_message.Message):
    __slots__ = ("subscribe", "credit", "acks", "nacks", "replies")
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    NACKS_FIELD_NUMBER: _ClassVar[int]
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    subscribe: SubscribeRequest
    credit: int
    acks: _containers.RepeatedScalarFieldContainer[int]
    nacks: _containers.RepeatedCompositeFieldContainer[Nack]
    replies: _containers.RepeatedCompositeFieldContainer[Reply]
    def __init__(self, subscribe: _Optional[_Union[SubscribeRequest, _Mapping]] = ..., credit: _Optional[int] = ..., acks: _Optional[_Iterable[int]] = ..., nacks: _Optional[_Iterable[_Union[Nack, _Mapping]]] = ..., replies: _Optional[_Iterable[_Union[Reply, _Mapping]]] = ...) -> None: ...

class CallRequest(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: Message
    def __init__(self, message: _Optional[_Union[Message, _Mapping]] = ...) -> None: ...

class CallResponse(_message.Message):
    __slots__ = ("body", "headers", "content_type")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BODY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    headers: _containers.ScalarMap[str, str]
    content_type: str
    def __init__(self, body: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, str]] = ..., content_type: _Optional[str] = ...) -> None: ...
