"""What :class:`chorus_client.Client` returns: records, reads, append outcomes, node status."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional

if TYPE_CHECKING:  # pragma: no cover
    from ._pb import chorus_pb2 as pb
    from .errors import ChorusError

__all__ = [
    "Record",
    "ReadResult",
    "Outcome",
    "Committed",
    "Failed",
    "Unknown",
    "NodeStatus",
]


@dataclass(frozen=True)
class Record:
    """A committed record: its LSN (log position), CSN (commit sequence number) and data."""

    lsn: int
    csn: int
    data: bytes


@dataclass(frozen=True)
class ReadResult:
    """One read: the records, where to continue (``next_lsn``) and the committed end the
    answering node knew (``committed_end``): the read reached it when
    ``next_lsn >= committed_end``."""

    records: List[Record]
    next_lsn: int
    committed_end: int


class Outcome:
    """The final result of one appended record: :class:`Committed`, :class:`Failed` or
    :class:`Unknown`. Exactly one of :attr:`committed`, :attr:`failed`, :attr:`unknown`
    is true."""

    __slots__ = ()

    @property
    def committed(self) -> bool:
        """The record is in the log, at :attr:`Committed.lsn`."""
        return isinstance(self, Committed)

    @property
    def failed(self) -> bool:
        """The record is not in the log and never will be: appending it again cannot
        duplicate it."""
        return isinstance(self, Failed)

    @property
    def unknown(self) -> bool:
        """The record may or may not be in the log: read the log to find out; never
        append it again blindly."""
        return isinstance(self, Unknown)


@dataclass(frozen=True)
class Committed(Outcome):
    """The record committed at ``lsn`` with commit sequence number ``csn``."""

    lsn: int
    csn: int


@dataclass(frozen=True)
class Failed(Outcome):
    """The record did not commit and never will.

    Either the leader appended it (``lsn``/``csn`` set) and it failed (a leader change
    dropped it), or it was never appended (``lsn`` is None): the leader accepted only
    the records before it in the request (a refusal cut the request short). Either way
    it is safe to append again.
    """

    reason: str
    lsn: Optional[int] = None
    csn: Optional[int] = None

    @property
    def appended(self) -> bool:
        """Whether the leader appended the record (and then it failed)."""
        return self.lsn is not None


@dataclass(frozen=True)
class Unknown(Outcome):
    """Whether the record committed is not known: the call was cut off before its answer
    (the connection broke, no answer within ``call_timeout``), or the leader stopped
    before it learned the outcome (then ``lsn``/``csn`` say where it would be). Read the
    log to find out (e.g. by a unique id in the data, or :meth:`Client.locate` with the
    CSN); never append it again blindly, which could append it twice."""

    reason: str
    lsn: Optional[int] = None
    csn: Optional[int] = None


@dataclass
class NodeStatus:
    """One endpoint's answer to Status: ``response`` (a ``StatusResponse`` message), or
    ``error`` if it did not answer."""

    endpoint: str
    response: Optional["pb.StatusResponse"] = None
    error: Optional["ChorusError"] = None
    groups: List["pb.GroupStatus"] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the endpoint answered."""
        return self.response is not None

    @property
    def node(self) -> Optional[int]:
        """The node id of the endpoint, when it answered."""
        return self.response.node if self.response is not None else None

    def group(self, group: int) -> Optional["pb.GroupStatus"]:
        """This node's status of ``group``, if it hosts it."""
        for g in self.groups:
            if g.group == group:
                return g
        return None
