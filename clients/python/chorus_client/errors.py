"""Exceptions raised by :class:`chorus_client.Client`.

Every exception is a :class:`ChorusError`. Those that carry a gRPC status the server
answered are :class:`StatusError` subclasses, one per status code the API uses
(``proto/chorus.proto`` lists what each means); :func:`status_error` picks the class.

An exception raised by :meth:`Client.append <chorus_client.Client.append>` always means
that **no record of the call was appended**: the request was refused whole, or never
reached a node (see the README's retry rules). An append cut off before its answer is
not an exception: its records come back as :class:`~chorus_client.Unknown` outcomes.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple, Type

import grpc

__all__ = [
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
    "status_error",
    "LEADER_KEY",
    "NOT_STARTED_KEY",
    "ACCESS_MODE_KEY",
    "REFUSED_KEY",
]

#: Trailer of a follower's FAILED_PRECONDITION: the leader's node id, when it knows it.
LEADER_KEY = "chorus-leader"
#: Trailer of a refusal that did nothing (the group is not running on that node): even an
#: append may go to another node.
NOT_STARTED_KEY = "chorus-not-started"
#: Trailer of a leader's refusal of a write its group's access mode does not take: no
#: other node would take it either.
ACCESS_MODE_KEY = "chorus-access-mode"
#: Trailer of a leader's refusal of an operator's change by its strict check.
REFUSED_KEY = "chorus-refused"


class ChorusError(Exception):
    """Base class of every error of this package."""


class ConfigError(ChorusError, ValueError):
    """The client was given something unusable: a bad endpoint, a bad token, TLS files
    that cannot be read or are not PEM, a certificate without its key."""


class NoEndpoints(ConfigError):
    """No endpoints were given."""

    def __init__(self) -> None:
        super().__init__("no endpoints given")


class Unreachable(ChorusError):
    """No connection could be made to an endpoint (nothing was sent to it)."""

    def __init__(self, endpoint: str, detail: str) -> None:
        super().__init__(f"{endpoint}: unreachable: {detail}")
        self.endpoint = endpoint
        self.detail = detail


class NoLeader(ChorusError):
    """No endpoint accepted a leader-only operation within ``Client.leader_timeout``:
    every one answered "not the leader" or refused the request before doing anything,
    or could not be reached. Nothing was done; the call may be retried later."""

    def __init__(self, group: int, waited: float, last: str) -> None:
        super().__init__(
            f"no leader found for group {group} within {waited:.1f}s (last answer: {last})"
        )
        self.group = group
        self.waited = waited
        self.last = last


class Indeterminate(ChorusError):
    """A non-idempotent request other than an append was cut off before its answer (the
    connection broke, or no answer came within ``call_timeout``): it may or may not have
    taken effect. :meth:`Client.append <chorus_client.Client.append>` reports this case
    as :class:`~chorus_client.Unknown` outcomes instead of raising it."""

    def __init__(self, endpoint: str, detail: str) -> None:
        super().__init__(
            f"{endpoint}: outcome unknown, the request was cut off before its answer: {detail}"
        )
        self.endpoint = endpoint
        self.detail = detail


class StatusError(ChorusError):
    """The server (or gRPC on the way to it) answered with an error status.

    Attributes: ``endpoint``, ``code`` (a :class:`grpc.StatusCode`), ``details`` (the
    status message) and ``trailers`` (the trailing metadata, as a dict).
    """

    def __init__(
        self,
        endpoint: str,
        code: grpc.StatusCode,
        details: str,
        trailers: Optional[Dict[str, str]] = None,
    ) -> None:
        super().__init__(f"{endpoint}: {code.name}: {details}")
        self.endpoint = endpoint
        self.code = code
        self.details = details
        self.trailers: Dict[str, str] = dict(trailers or {})

    @property
    def leader_hint(self) -> Optional[int]:
        """The leader's node id named by a ``chorus-leader`` trailer, if any."""
        v = self.trailers.get(LEADER_KEY)
        try:
            return int(v) if v is not None else None
        except ValueError:
            return None


class Unauthenticated(StatusError):
    """UNAUTHENTICATED: the node's API needs a bearer token (``token=``) and the call
    carried none, or one that is not one of the node's identities."""


class PermissionDenied(StatusError):
    """PERMISSION_DENIED: the token's identity may not do this (its classes ``read``,
    ``append``, ``admin``, or its groups); the message names what was missing."""


class FailedPrecondition(StatusError):
    """FAILED_PRECONDITION: not the leader (leader-only operations try the other
    endpoints first, so this surfaces from other operations), or a state that does not
    allow the operation."""


class AccessModeRefused(FailedPrecondition):
    """The leader refused a write its group's access mode does not take (an append to a
    mirror group, or either kind of write during a switch). Nothing was written and no
    other node would take it, so it is not retried elsewhere."""


class StrictCheckRefused(FailedPrecondition):
    """The leader refused an operator's change by its strict check (``chorus-refused``)."""


class ResourceExhausted(StatusError):
    """RESOURCE_EXHAUSTED: the replication window is full, the group's queue is busy or
    the leader's disk is low. Nothing was appended; retry after a moment."""


class InvalidArgument(StatusError):
    """INVALID_ARGUMENT: a bad request (a record too large, too many records, ...)."""


class NotFound(StatusError):
    """NOT_FOUND: no such group on the node, or an LSN that is not a record."""


class OutOfRange(StatusError):
    """OUT_OF_RANGE: an LSN not yet committed, or trimmed."""


class Unimplemented(StatusError):
    """UNIMPLEMENTED: the operation does not exist for the group's mode."""


class Unavailable(StatusError):
    """UNAVAILABLE: the group stopped, the node shuts down, or no endpoint answered."""


class Aborted(StatusError):
    """ABORTED: e.g. a configuration change while another is under way."""


class AlreadyExists(StatusError):
    """ALREADY_EXISTS."""


class Internal(StatusError):
    """INTERNAL: the node failed to do the request (its storage failed before the request
    was accepted)."""


class DataLoss(StatusError):
    """DATA_LOSS: the node found damaged data while answering."""


class DeadlineExceeded(StatusError):
    """DEADLINE_EXCEEDED: no answer within ``call_timeout`` (a read or status call)."""


class Cancelled(StatusError):
    """CANCELLED."""


class UnknownStatus(StatusError):
    """UNKNOWN, or a status code this client does not know."""


_BY_CODE: Dict[grpc.StatusCode, Type[StatusError]] = {
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.DATA_LOSS: DataLoss,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNKNOWN: UnknownStatus,
}


def trailers_of(e: grpc.RpcError) -> Dict[str, str]:
    """The trailing metadata of a failed call, as a dict (text values only)."""
    out: Dict[str, str] = {}
    md: Tuple = ()
    try:
        md = e.trailing_metadata() or ()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - not every RpcError carries metadata
        md = ()
    for item in md:
        k, v = item[0], item[1]
        if isinstance(v, bytes):
            continue
        out[k] = v
    return out


def status_error(endpoint: str, e: grpc.RpcError) -> StatusError:
    """The typed exception for a failed gRPC call to ``endpoint``."""
    code = e.code()  # type: ignore[attr-defined]
    details = e.details() or ""  # type: ignore[attr-defined]
    trailers = trailers_of(e)
    cls = _BY_CODE.get(code, UnknownStatus)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        if ACCESS_MODE_KEY in trailers:
            cls = AccessModeRefused
        elif REFUSED_KEY in trailers:
            cls = StrictCheckRefused
    return cls(endpoint, code, details, trailers)
