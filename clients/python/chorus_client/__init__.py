"""Python client for Chorus, a replicated write-ahead log.

Example::

    from chorus_client import Client

    with Client(["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]) as c:
        for outcome in c.append(1, [b"a", b"b"]):
            print(outcome)        # Committed(lsn=..., csn=...), Failed(...) or Unknown(...)
        for r in c.tail(1, 0):    # committed records, waiting for new ones (endless)
            print(r.lsn, r.data)

See :class:`Client` and the README (retry rules: which outcomes may be appended again).
The generated gRPC stubs are in :mod:`chorus_client._pb` (``chorus_pb2``,
``chorus_pb2_grpc``), re-exported as :data:`pb` and :data:`pb_grpc`.
"""

from .client import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_LEADER_TIMEOUT,
    DEFAULT_TAIL_RESUME,
    Client,
    Tail,
    pb,
    pb_grpc,
)
from .errors import (
    Aborted,
    AccessModeRefused,
    AlreadyExists,
    Cancelled,
    ChorusError,
    ConfigError,
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    Indeterminate,
    Internal,
    InvalidArgument,
    NoEndpoints,
    NoLeader,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    StatusError,
    StrictCheckRefused,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    UnknownStatus,
    Unreachable,
)
from .models import (
    Committed,
    Failed,
    NodeStatus,
    Outcome,
    ReadResult,
    Record,
    Unknown,
)

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Tail",
    "Record",
    "ReadResult",
    "Outcome",
    "Committed",
    "Failed",
    "Unknown",
    "NodeStatus",
    "ChorusError",
    "ConfigError",
    "NoEndpoints",
    "Unreachable",
    "NoLeader",
    "Indeterminate",
    "StatusError",
    "Unauthenticated",
    "PermissionDenied",
    "FailedPrecondition",
    "AccessModeRefused",
    "StrictCheckRefused",
    "ResourceExhausted",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "Unimplemented",
    "Unavailable",
    "Aborted",
    "AlreadyExists",
    "Internal",
    "DataLoss",
    "DeadlineExceeded",
    "Cancelled",
    "UnknownStatus",
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_LEADER_TIMEOUT",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_TAIL_RESUME",
    "pb",
    "pb_grpc",
]
