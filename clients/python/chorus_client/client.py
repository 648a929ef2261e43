"""The Chorus client: :class:`Client` and its :class:`Tail` iterator.

It behaves as the Rust client (``crates/chorus-client/src/lib.rs``) does:

* Leader-only operations (append, leader transfer) go to the endpoint that last accepted
  one for the group (the first endpoint at first) and move on to the next endpoint when
  the answer says the request was not taken there: FAILED_PRECONDITION (not the leader;
  the ``chorus-leader`` trailer may name the leader's node id, which this client follows
  when it knows that node's endpoint), an UNAVAILABLE or UNKNOWN marked
  ``chorus-not-started``, or no connection at all. It goes round the endpoints, 50 ms
  apart, for ``leader_timeout`` seconds, then raises :class:`~chorus_client.NoLeader`.
* A non-idempotent call (an append) cut off before its answer (UNAVAILABLE, UNKNOWN,
  CANCELLED or DEADLINE_EXCEEDED without the ``chorus-not-started`` mark, i.e. the
  connection broke mid-call, the replica stopped, or no answer within ``call_timeout``)
  is never retried: an append then reports every record :class:`~chorus_client.Unknown`.
* Reads (read, locate, tail) go to the first endpoint that answers, moving on only when
  one is UNAVAILABLE or unreachable.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import (
    Any,
    Deque,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Union,
)

import grpc

from .errors import (
    ACCESS_MODE_KEY,
    LEADER_KEY,
    NOT_STARTED_KEY,
    REFUSED_KEY,
    ChorusError,
    ConfigError,
    Indeterminate,
    NoEndpoints,
    NoLeader,
    Unreachable,
    status_error,
    trailers_of,
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

try:
    from ._pb import chorus_pb2 as pb
    from ._pb import chorus_pb2_grpc as pb_grpc
except ImportError as _e:  # pragma: no cover - only without generated stubs
    raise ImportError(
        "chorus_client's gRPC stubs are missing: run ./generate.sh in clients/python "
        f"before installing ({_e})"
    ) from _e

__all__ = [
    "Client",
    "Tail",
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_LEADER_TIMEOUT",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_TAIL_RESUME",
]

log = logging.getLogger("chorus_client")

#: How long one call waits for its answer before it is cut off (an append then reports
#: its records Unknown): longer than any commit a live cluster takes, elections included.
DEFAULT_CALL_TIMEOUT = 30.0
#: How long leader-only operations keep looking for a leader.
DEFAULT_LEADER_TIMEOUT = 10.0
#: How long a new connection may take before the endpoint counts as unreachable.
DEFAULT_CONNECT_TIMEOUT = 2.0
#: How long a :class:`Tail` tries to reach another replica after losing one.
DEFAULT_TAIL_RESUME = 30.0

# HTTP/2 PING interval on every connection, idle or not, and how long a PING may go
# unanswered before the connection is closed (failing its calls): a dead peer that never
# closed its side is noticed, as by the Rust client.
_KEEPALIVE_MS = 10_000
_MAX_MESSAGE = 64 << 20

_C = grpc.StatusCode
# A non-idempotent call failing with one of these may have taken effect (unless marked
# or never sent).
_CUT_OFF = frozenset({_C.UNAVAILABLE, _C.UNKNOWN, _C.CANCELLED, _C.DEADLINE_EXCEEDED})
# A leader-only call failing with one of these (unmarked) goes on to the next endpoint.
_TRY_NEXT = frozenset({_C.FAILED_PRECONDITION, _C.UNAVAILABLE, _C.UNKNOWN})
# A tail stream failing with one of these goes on at another replica (as `chorus tail -f`).
_TAIL_RESUMABLE = frozenset({_C.UNAVAILABLE, _C.UNKNOWN, _C.CANCELLED, _C.ABORTED, _C.INTERNAL})

PathOrPem = Union[str, bytes, "os.PathLike[str]"]


def _not_sent(e: grpc.RpcError) -> bool:
    """Whether a failed call surely did nothing: the server refused it marked
    ``chorus-not-started``, or no connection could be made (the Rust client's
    "connection refused"/"tcp connect error"; gRPC core's "failed to connect to all
    addresses", the call never having been given a connection). Then even an append may
    go to another endpoint."""
    if NOT_STARTED_KEY in trailers_of(e):
        return True
    m = (e.details() or "").lower()  # type: ignore[attr-defined]
    return (
        "connection refused" in m
        or "tcp connect error" in m
        or "failed to connect to all addresses" in m
    )


@dataclass(frozen=True)
class _Endpoint:
    text: str  # as shown in errors: scheme://host:port
    target: str  # host:port, as gRPC dials it
    tls: bool


def _parse_endpoint(ep: str, tls_default: bool) -> _Endpoint:
    """``host:port``, ``http://host:port`` or ``https://host:port``. With TLS configured
    (``ca=``), every endpoint is dialled with TLS (as the Rust client upgrades
    ``http://``): a node serving TLS refuses plain text anyway."""
    if not isinstance(ep, str) or not ep.strip():
        raise ConfigError(f"endpoint {ep!r} is not valid (expected e.g. 127.0.0.1:7001)")
    raw = ep.strip()
    scheme: Optional[str] = None
    rest = raw
    if "://" in raw:
        scheme, rest = raw.split("://", 1)
        if scheme not in ("http", "https"):
            raise ConfigError(
                f"endpoint `{ep}` is not valid: scheme `{scheme}` (expected http:// or https://)"
            )
    rest = rest.rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or "/" in rest or " " in rest or not port.isdigit() or not (
        0 < int(port) < 65536
    ):
        raise ConfigError(f"endpoint `{ep}` is not valid (expected e.g. http://127.0.0.1:7001)")
    tls = tls_default or scheme == "https"
    return _Endpoint(text=f"{'https' if tls else 'http'}://{rest}", target=rest, tls=tls)


def _pem(what: str, v: Optional[PathOrPem], kind: str) -> Optional[bytes]:
    """PEM bytes given as bytes, or read from a path."""
    if v is None:
        return None
    if isinstance(v, (bytes, bytearray)):
        data = bytes(v)
        where = "(bytes given)"
    else:
        path = os.fspath(v)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ConfigError(f"{what} `{path}`: {e}") from e
        where = f"`{path}`"
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{what} {where} holds no PEM {kind}")
    return data


def _bearer(token: Optional[str]) -> Optional[str]:
    if token is None:
        return None
    t = token.strip()
    if not t or not all(0x21 <= ord(c) <= 0x7E for c in t):
        raise ConfigError(
            "the token is not printable ASCII (a bearer token is sent as an HTTP header)"
        )
    return f"Bearer {t}"


def _wait_connected(ch: grpc.Channel, timeout: float) -> Optional[grpc.ChannelConnectivity]:
    """Starts connecting and waits until the channel is ready or has failed (or the
    timeout passes): the last state seen."""
    done = threading.Event()
    seen: List[grpc.ChannelConnectivity] = []

    def cb(state: grpc.ChannelConnectivity) -> None:
        seen.append(state)
        if state in (
            grpc.ChannelConnectivity.READY,
            grpc.ChannelConnectivity.TRANSIENT_FAILURE,
            grpc.ChannelConnectivity.SHUTDOWN,
        ):
            done.set()

    ch.subscribe(cb, try_to_connect=True)
    try:
        done.wait(timeout)
    finally:
        ch.unsubscribe(cb)
    return seen[-1] if seen else None


def _wait_headers(call: Any, timeout: float) -> bool:
    """Waits for a streaming call's response headers (or its end): False if neither
    came within ``timeout`` seconds."""
    done = threading.Event()

    def wait() -> None:
        try:
            call.initial_metadata()
        finally:
            done.set()

    threading.Thread(target=wait, name="chorus-tail-open", daemon=True).start()
    return done.wait(timeout)


class _Conn:
    __slots__ = ("channel", "stub")

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.stub = pb_grpc.ChorusStub(channel)


def _record(r: Any) -> Record:
    return Record(lsn=r.lsn, csn=r.csn, data=bytes(r.data))


class Client:
    """A connection to a Chorus cluster, given the API endpoints of its nodes.

    Args:
        endpoints: the nodes' API endpoints: ``host:port``, ``http://host:port`` or
            ``https://host:port`` (a single string may list several, comma-separated).
            Order matters only as the order they are tried in.
        ca: the CA certificate(s) (PEM; a path, or the bytes) that sign the nodes' API
            certificates. Given, every connection is TLS.
        cert, key: this client's certificate chain and private key (PEM; paths or bytes),
            both or neither, for nodes that require client certificates (mutual TLS).
        tls_name: the name the nodes' certificates carry, checked instead of each
            endpoint's host (``chorus dev --tls`` certificates name ``localhost``).
        token: a bearer token, sent on every call as ``authorization: Bearer <token>``
            (nodes with ``[api_auth]``).
        call_timeout: seconds one call may wait for its answer before it is cut off (an
            append then reports its records :class:`Unknown`). Streams are not bounded by
            it (they rely on HTTP/2 keepalive pings to notice a dead peer).
        leader_timeout: seconds leader-only operations keep looking for a leader.
        connect_timeout: seconds a new connection may take.

    Connections open lazily, one per endpoint, and are reopened after a failure. A
    client may be shared between threads. Use it as a context manager, or call
    :meth:`close`, to close its connections.
    """

    def __init__(
        self,
        endpoints: Union[str, Sequence[str]],
        *,
        ca: Optional[PathOrPem] = None,
        cert: Optional[PathOrPem] = None,
        key: Optional[PathOrPem] = None,
        tls_name: Optional[str] = None,
        token: Optional[str] = None,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        leader_timeout: float = DEFAULT_LEADER_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        eps = list(endpoints)
        if not eps:
            raise NoEndpoints()
        if (cert is None) != (key is None):
            raise ConfigError(
                "a client certificate needs its key and a key its certificate (cert= and key= together)"
            )
        self._ca = _pem("ca", ca, "certificate")
        self._cert = _pem("cert", cert, "certificate")
        self._key = _pem("key", key, "private key")
        if self._cert is not None and self._ca is None:
            # As the Rust client: TLS settings start from the CA.
            raise ConfigError("cert= and key= need ca= (the CA that signs the nodes' certificates)")
        self._tls_name = tls_name
        self._endpoints = [_parse_endpoint(e, self._ca is not None) for e in eps]
        auth = _bearer(token)
        self._metadata = (("authorization", auth),) if auth else ()
        self.call_timeout = float(call_timeout)
        self.leader_timeout = float(leader_timeout)
        self.connect_timeout = float(connect_timeout)
        self._lock = threading.Lock()
        self._conns: List[Optional[_Conn]] = [None] * len(self._endpoints)
        self._leader: Dict[int, int] = {}
        # Node id -> endpoint index, learned from Status answers (to follow leader hints).
        self._node_index: Dict[int, int] = {}
        self._learned_at: Optional[float] = None
        self._closed = False

    @classmethod
    def from_env(
        cls, endpoints: Optional[Union[str, Sequence[str]]] = None, **kwargs: Any
    ) -> "Client":
        """A client configured as the ``chorus`` CLI is from its environment:
        ``CHORUS_ENDPOINTS`` (when ``endpoints`` is not given), ``CHORUS_CA``,
        ``CHORUS_CERT``, ``CHORUS_KEY``, ``CHORUS_TLS_NAME`` and ``CHORUS_TOKEN``
        (what ``chorus dev --tls`` prints). Keyword arguments override them."""
        env = os.environ
        if endpoints is None:
            endpoints = env.get("CHORUS_ENDPOINTS", "")
        for name, var in (
            ("ca", "CHORUS_CA"),
            ("cert", "CHORUS_CERT"),
            ("key", "CHORUS_KEY"),
            ("tls_name", "CHORUS_TLS_NAME"),
            ("token", "CHORUS_TOKEN"),
        ):
            if name not in kwargs and env.get(var):
                kwargs[name] = env[var]
        return cls(endpoints, **kwargs)

    # -- connections ---------------------------------------------------------------

    @property
    def endpoints(self) -> List[str]:
        """The endpoints, as ``scheme://host:port``."""
        return [e.text for e in self._endpoints]

    def known_leader(self, group: int) -> Optional[str]:
        """The endpoint that last accepted a leader-only call for ``group`` (where the
        next one goes first), if any."""
        with self._lock:
            i = self._leader.get(group)
        return self._endpoints[i].text if i is not None else None

    def close(self) -> None:
        """Closes every connection (and cancels the calls and tails open on them)."""
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, [None] * len(self._endpoints)
        for c in conns:
            if c is not None:
                c.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.endpoints!r})"

    def _new_channel(self, ep: _Endpoint) -> grpc.Channel:
        opts: List[tuple] = [
            ("grpc.keepalive_time_ms", _KEEPALIVE_MS),
            ("grpc.keepalive_timeout_ms", _KEEPALIVE_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
            # A channel of its own per connection: a reopened connection does not inherit
            # a failed one's reconnect backoff.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if ep.tls:
            if self._tls_name:
                opts.append(("grpc.ssl_target_name_override", self._tls_name))
            creds = grpc.ssl_channel_credentials(
                root_certificates=self._ca,
                private_key=self._key,
                certificate_chain=self._cert,
            )
            return grpc.secure_channel(ep.target, creds, options=opts)
        return grpc.insecure_channel(ep.target, options=opts)

    def _stub(self, i: int) -> pb_grpc.ChorusStub:
        """The stub for endpoint ``i``, connecting first if needed (raises Unreachable
        if no connection can be made within ``connect_timeout``: nothing was sent)."""
        with self._lock:
            if self._closed:
                raise ChorusError("the client is closed")
            c = self._conns[i]
            if c is not None:
                return c.stub
        ep = self._endpoints[i]
        ch = self._new_channel(ep)
        state = _wait_connected(ch, self.connect_timeout)
        if state != grpc.ChannelConnectivity.READY:
            # Ask once without waiting: gRPC says why it could not connect (refused, TLS
            # handshake, ...). A call that goes through means it connected meanwhile.
            detail = f"no connection within {self.connect_timeout:g}s"
            try:
                pb_grpc.ChorusStub(ch).Status(
                    pb.StatusRequest(group=0),
                    timeout=0.5,
                    metadata=self._metadata,
                    wait_for_ready=False,
                )
                state = grpc.ChannelConnectivity.READY
            except grpc.RpcError as e:
                code = e.code()  # type: ignore[attr-defined]
                if code not in (_C.UNAVAILABLE, _C.DEADLINE_EXCEEDED):
                    state = grpc.ChannelConnectivity.READY  # it answered
                elif code == _C.UNAVAILABLE:
                    detail = e.details() or detail  # type: ignore[attr-defined]
            if state != grpc.ChannelConnectivity.READY:
                ch.close()
                raise Unreachable(ep.text, detail)
        conn = _Conn(ch)
        with self._lock:
            if self._conns[i] is None and not self._closed:
                self._conns[i] = conn
                return conn.stub
            existing = self._conns[i]
        ch.close()
        if existing is None:
            raise ChorusError("the client is closed")
        return existing.stub

    def _forget(self, i: int, stub: Optional[pb_grpc.ChorusStub] = None) -> None:
        """Drops endpoint ``i``'s connection (the one ``stub`` is on, if given: not a
        newer one another thread opened meanwhile); the next call opens a new one. Not
        closed here: streams still open on it end by themselves."""
        with self._lock:
            c = self._conns[i]
            if c is not None and (stub is None or c.stub is stub):
                self._conns[i] = None

    # -- how calls are routed ------------------------------------------------------

    def _learn_nodes(self, group: int) -> None:
        """Learns the node id behind each endpoint not known yet (Status of ``group``: a
        read), to follow leader hints; at most every 5 s. An identity that may not read
        learns nothing, and the client just goes round the endpoints."""
        with self._lock:
            now = time.monotonic()
            if self._learned_at is not None and now - self._learned_at < 5.0:
                return
            self._learned_at = now
        for i in range(len(self._endpoints)):
            with self._lock:
                if i in self._node_index.values():
                    continue
            try:
                r = self._stub(i).Status(
                    pb.StatusRequest(group=group),
                    timeout=min(self.call_timeout, 2.0),
                    metadata=self._metadata,
                )
            except (grpc.RpcError, ChorusError):
                continue
            with self._lock:
                self._node_index[r.node] = i

    def _on_leader(self, group: int, idempotent: bool, method: str, request: Any) -> Any:
        """Runs a leader-only call, trying endpoints until one accepts (module docs). A
        call that is not ``idempotent`` is retried elsewhere only when it surely did not
        take effect; cut off, it raises :class:`Indeterminate`."""
        n = len(self._endpoints)
        start = time.monotonic()
        with self._lock:
            i = self._leader.get(group, 0)
        last = ""
        while True:
            # One round: every endpoint once, in order from where it is, a leader hint
            # jumping ahead to an endpoint not tried yet this round (so a stale hint
            # cannot keep the others from being tried).
            tried = set()
            while True:
                tried.add(i)
                ep = self._endpoints[i].text
                hinted: Optional[int] = None
                try:
                    stub = self._stub(i)
                except Unreachable as e:
                    last = str(e)
                else:
                    try:
                        resp = getattr(stub, method)(
                            request, timeout=self.call_timeout, metadata=self._metadata
                        )
                    except grpc.RpcError as e:
                        code = e.code()  # type: ignore[attr-defined]
                        if not idempotent and code in _CUT_OFF and not _not_sent(e):
                            self._forget(i, stub)
                            if code == _C.DEADLINE_EXCEEDED:
                                detail = f"no answer within {self.call_timeout:g}s"
                            else:
                                detail = f"{code.name}: {e.details()}"  # type: ignore[attr-defined]
                            raise Indeterminate(ep, detail) from None
                        trailers = trailers_of(e)
                        if (
                            code not in _TRY_NEXT
                            or ACCESS_MODE_KEY in trailers
                            or REFUSED_KEY in trailers
                        ):
                            raise status_error(ep, e) from None
                        last = f"{ep}: {e.details()}"  # type: ignore[attr-defined]
                        if code != _C.FAILED_PRECONDITION:
                            self._forget(i, stub)
                        hinted = self._hinted(group, trailers)
                    else:
                        with self._lock:
                            self._leader[group] = i
                        return resp
                if hinted is not None and hinted not in tried:
                    i = hinted
                    continue
                untried = [j % n for j in range(i + 1, i + n) if j % n not in tried]
                if not untried:
                    break
                i = untried[0]
            i = (i + 1) % n
            waited = time.monotonic() - start
            if waited >= self.leader_timeout:
                raise NoLeader(group, waited, last)
            time.sleep(0.05)

    def _hinted(self, group: int, trailers: Dict[str, str]) -> Optional[int]:
        """The endpoint index of the leader a ``chorus-leader`` trailer names, if known."""
        v = trailers.get(LEADER_KEY)
        if v is None:
            return None
        try:
            node = int(v)
        except ValueError:
            return None
        with self._lock:
            j = self._node_index.get(node)
        if j is None:
            self._learn_nodes(group)
            with self._lock:
                j = self._node_index.get(node)
        return j

    def _on_any(self, method: str, request: Any) -> Any:
        """Runs a call on the first endpoint that answers (reads work on any replica):
        the next one is tried only when one is unreachable or UNAVAILABLE."""
        last: ChorusError = NoEndpoints()
        for i, ep in enumerate(self._endpoints):
            try:
                stub = self._stub(i)
            except Unreachable as e:
                last = e
                continue
            try:
                return getattr(stub, method)(
                    request, timeout=self.call_timeout, metadata=self._metadata
                )
            except grpc.RpcError as e:
                if e.code() == _C.UNAVAILABLE:  # type: ignore[attr-defined]
                    self._forget(i, stub)
                    last = status_error(ep.text, e)
                    continue
                raise status_error(ep.text, e) from None
        raise last

    # -- the API ---------------------------------------------------------------------

    def append(
        self,
        group: int,
        records: Iterable[Union[bytes, bytearray, memoryview, str]],
        *,
        ref_csn: int = 0,
    ) -> List[Outcome]:
        """Appends records to ``group`` at its leader, in order (consecutive LSNs), and
        waits for each one's final result.

        Returns one outcome per record, in order:

        * :class:`Committed` ``(lsn, csn)``: it is in the log.
        * :class:`Failed` ``(reason)``: it is not and never will be; appending it again
          cannot duplicate it. ``lsn`` is None for a record the leader never appended
          (a refusal cut the request short after the records before it).
        * :class:`Unknown` ``(reason)``: it may or may not have committed; read the log
          to find out, never append it again blindly. Every record is Unknown when the
          call was cut off before its answer (the connection broke mid-call, the
          replica stopped, no answer within ``call_timeout``); one record is when the
          leader stopped before it learned that record's outcome (``lsn`` set).

        Raises (only when **no** record was appended, so the call may be retried):
        :class:`NoLeader` (no endpoint took it within ``leader_timeout``),
        :class:`Unauthenticated`, :class:`PermissionDenied`, :class:`ResourceExhausted`
        (window full, disk low: retry after a moment), :class:`InvalidArgument`,
        :class:`NotFound`, :class:`AccessModeRefused`, :class:`Unimplemented`, and
        :class:`StatusError` for any other refusal.

        ``records`` are bytes (a ``str`` is encoded as UTF-8). ``ref_csn``: every
        record's CSN is at least this.
        """
        recs = [r.encode("utf-8") if isinstance(r, str) else bytes(r) for r in records]
        if not recs:
            return []
        req = pb.AppendRequest(group=group, records=recs, ref_csn=ref_csn)
        try:
            resp = self._on_leader(group, False, "Append", req)
        except Indeterminate as e:
            why = (
                f"the append was cut off before its answer ({e.endpoint}: {e.detail}); "
                "it may have committed"
            )
            return [Unknown(why) for _ in recs]
        out: List[Outcome] = []
        for r in list(resp.results)[: len(recs)]:
            if r.unknown:
                out.append(Unknown(r.unknown, r.lsn, r.csn))
            elif r.outcome == pb.COMMITTED:
                out.append(Committed(r.lsn, r.csn))
            elif r.outcome == pb.FAILED:
                out.append(
                    Failed("the record did not commit (dropped by a leader change)", r.lsn, r.csn)
                )
            else:  # not in the protocol: take no chance
                out.append(Unknown(f"the server answered outcome {r.outcome}", r.lsn, r.csn))
        accepted = len(out)
        for _ in range(accepted, len(recs)):
            out.append(
                Failed(
                    f"not appended: the leader accepted only the first {accepted} of "
                    f"{len(recs)} records of the request (a refusal such as not the leader "
                    "any more or a full window cut it short)"
                )
            )
        return out

    def read(self, group: int, from_lsn: int = 0, max_records: int = 0) -> ReadResult:
        """Reads committed records of ``group`` from ``from_lsn`` (a record's LSN, or 0
        for the start of the log), at most ``max_records`` (0: the server's default,
        1000), from the first endpoint that answers. A follower answers with what it
        knows to be committed, which may lag the leader by a moment."""
        r = self._on_any(
            "Read", pb.ReadRequest(group=group, from_lsn=from_lsn, max_records=max_records)
        )
        return ReadResult([_record(x) for x in r.records], r.next_lsn, r.committed_end)

    def read_all(self, group: int, from_lsn: int = 0) -> Iterator[Record]:
        """Every committed record of ``group`` from ``from_lsn`` up to the committed end
        (as the answering node knows it when it gets there), read in batches."""
        while True:
            r = self.read(group, from_lsn)
            yield from r.records
            if not r.records or r.next_lsn >= r.committed_end:
                return
            from_lsn = r.next_lsn

    def tail(
        self,
        group: int,
        from_lsn: int = 0,
        *,
        max_records: int = 0,
        resume_timeout: float = DEFAULT_TAIL_RESUME,
    ) -> "Tail":
        """Streams the committed records of ``group`` from ``from_lsn`` on, waiting for
        new ones: an iterator of :class:`Record` that does not end by itself. The
        stream is opened here, at the first endpoint that takes it (errors such as
        :class:`Unauthenticated` or :class:`NotFound` are raised here).

        If the replica serving it goes away (the stream fails UNAVAILABLE, UNKNOWN,
        CANCELLED, ABORTED or INTERNAL, or the endpoint cannot be reached) it resumes
        from the next record at the other endpoints, round and round, for up to
        ``resume_timeout`` seconds, as ``chorus tail -f`` does; no record is skipped or
        repeated. A replica that refuses the resumed position OUT_OF_RANGE has not yet
        learned the commit point that covers it, and the resume goes on round too.
        Other errors (Unauthenticated, NotFound, OutOfRange if ``from_lsn`` itself is
        not committed or was trimmed...) are raised from the iteration. Stop it with :meth:`Tail.close` (from
        any thread) or by leaving a ``with`` block.
        """
        t = Tail(self, group, from_lsn, max_records, resume_timeout)
        t._connect(resuming=False)
        t._opened = True
        return t

    def locate(self, group: int, csn: int) -> Optional[int]:
        """The LSN of the first committed record of ``group`` whose CSN is at least
        ``csn``, or None."""
        r = self._on_any("Locate", pb.LocateRequest(group=group, csn=csn))
        return r.lsn if r.found else None

    def status(self, group: int = 0) -> List[NodeStatus]:
        """Every endpoint's status of ``group`` (0: of every group it hosts), in endpoint
        order; an endpoint that does not answer has ``error`` set instead."""
        out: List[NodeStatus] = []
        for i, ep in enumerate(self._endpoints):
            try:
                stub = self._stub(i)
            except Unreachable as e:
                out.append(NodeStatus(ep.text, error=e))
                continue
            try:
                r = stub.Status(
                    pb.StatusRequest(group=group),
                    timeout=self.call_timeout,
                    metadata=self._metadata,
                )
            except grpc.RpcError as e:
                self._forget(i, stub)
                out.append(NodeStatus(ep.text, error=status_error(ep.text, e)))
                continue
            with self._lock:
                self._node_index[r.node] = i
            out.append(NodeStatus(ep.text, response=r, groups=list(r.groups)))
        return out

    def leader(self, group: int) -> Optional[NodeStatus]:
        """The status of the endpoint whose replica of ``group`` says it leads (the one
        with the highest proposal id if several do), or None."""
        best: Optional[NodeStatus] = None
        best_pid = -1
        for s in self.status(group):
            g = s.group(group)
            if g is not None and g.role == "leader" and g.proposal_id > best_pid:
                best, best_pid = s, g.proposal_id
        return best

    def transfer_leader(self, group: int, to: int, *, force: bool = False) -> None:
        """Hands leadership of ``group`` to node ``to`` (sent to the leader; idempotent,
        so retried elsewhere on any "not taken here" answer). Refused
        (:class:`StrictCheckRefused`) if ``to`` is down or behind, unless ``force``."""
        self._on_leader(
            group,
            True,
            "TransferLeader",
            pb.TransferLeaderRequest(group=group, to=to, force=force),
        )


class Tail:
    """An iterator of the committed :class:`Record` s of a group, from an LSN on (see
    :meth:`Client.tail`). :attr:`next_lsn` is where it has got to: the LSN the next
    record will have or follow (resume from there with a new tail)."""

    def __init__(
        self,
        client: Client,
        group: int,
        from_lsn: int,
        max_records: int,
        resume_timeout: float,
    ) -> None:
        self._client = client
        self.group = group
        #: Where the tail has got to.
        self.next_lsn = from_lsn
        self._start = from_lsn  # where it was opened
        # Since when (monotonic) replicas have refused the position OUT_OF_RANGE with no
        # record in between (None: they have not): bounded by resume_timeout.
        self._lagging_since: Optional[float] = None
        self._max = max_records
        self.resume_timeout = resume_timeout
        self._pending: Deque[Record] = collections.deque()
        self._call: Any = None
        self._index = 0  # the endpoint tried next
        self._serving: Optional[int] = None  # the endpoint streaming now
        self._serving_stub: Optional[pb_grpc.ChorusStub] = None
        self._lock = threading.Lock()
        self._closed = False
        self._opened = False  # opened once already: a new open is a resume
        #: How many times the stream was opened again after losing a replica.
        self.resumes = 0

    @property
    def endpoint(self) -> Optional[str]:
        """The endpoint streaming now, if any."""
        i = self._serving
        return self._client._endpoints[i].text if i is not None else None

    def __iter__(self) -> "Tail":
        return self

    def __enter__(self) -> "Tail":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Ends the tail: a blocked iteration (in another thread too) stops, and the
        iterator is exhausted."""
        with self._lock:
            self._closed = True
            call, self._call = self._call, None
        if call is not None:
            call.cancel()

    def _connect(self, resuming: bool) -> None:
        """Opens the stream at the next endpoint that takes it (round robin). The first
        open tries each endpoint once, as the Rust client's tail does; after a lost
        stream, it goes round for up to ``resume_timeout`` seconds, 200 ms between
        rounds, as ``chorus tail -f`` does."""
        c = self._client
        n = len(c._endpoints)
        give_up = time.monotonic() + (self.resume_timeout if resuming else 0.0)
        tried = 0
        while True:
            with self._lock:
                if self._closed:
                    return
            i = self._index % n
            self._index = i + 1
            ep = c._endpoints[i].text
            err: ChorusError
            try:
                stub = c._stub(i)
                call = stub.Tail(
                    pb.TailRequest(
                        group=self.group, from_lsn=self.next_lsn, max_records=self._max
                    ),
                    metadata=c._metadata,
                )
                # The stream is open once the server's headers arrive (within
                # call_timeout, as the Rust client bounds a stream's opening); a refusal
                # comes instead as the call's end.
                if not _wait_headers(call, c.call_timeout):
                    call.cancel()
                    c._forget(i, stub)
                    err = Unreachable(ep, f"the stream did not open within {c.call_timeout:g}s")
                elif call.done() and call.code() != grpc.StatusCode.OK:
                    code = call.code()
                    err = status_error(ep, call)
                    if not self._resumable(code, resuming):
                        raise err
                    c._forget(i, stub)
                else:
                    with self._lock:
                        if self._closed:
                            call.cancel()
                            return
                        self._call = call
                        self._serving = i
                        self._serving_stub = stub
                    if resuming:
                        self.resumes += 1
                    return
            except Unreachable as e:
                err = e
            tried += 1
            if tried >= n:
                if time.monotonic() >= give_up:
                    raise err
                tried = 0
                time.sleep(0.2)

    def _resumable(self, code: grpc.StatusCode, resuming: bool) -> bool:
        """Whether a stream that failed (or was refused) with ``code`` may go on at
        another replica. OUT_OF_RANGE is, once the tail has moved past where it was
        opened or is resuming: the position was then served by some replica, so one
        that refuses it has not yet learned the commit point that covers it (a
        follower's lags the leader's by a round) or has trimmed it, and another
        replica, or the same one a little later, serves it (as the Go client does)."""
        if code in _TAIL_RESUMABLE:
            return True
        return code == _C.OUT_OF_RANGE and (resuming or self.next_lsn != self._start)

    def _lost(self, e: grpc.RpcError) -> None:
        """The stream failed: raises unless another replica may carry on."""
        i = self._serving
        self._serving = None
        with self._lock:
            self._call = None
        ep = self._client._endpoints[i].text if i is not None else "tail"
        err = status_error(ep, e)
        if not self._resumable(err.code, self.resumes > 0):
            raise err
        if err.code == _C.OUT_OF_RANGE:
            # The replica took the stream and refused the position at once: it lags.
            # Asked again (the next endpoint) after a pause, within resume_timeout.
            now = time.monotonic()
            if self._lagging_since is None:
                self._lagging_since = now
            elif now - self._lagging_since >= self.resume_timeout:
                raise err
            time.sleep(0.2)
            return
        self._lagging_since = None
        if i is not None:
            self._client._forget(i, self._serving_stub)
        log.warning(
            "chorus tail of group %d: lost the stream (%s); resuming from %d",
            self.group,
            err,
            self.next_lsn,
        )

    def __next__(self) -> Record:
        while True:
            with self._lock:
                if self._closed:
                    self._pending.clear()
                    raise StopIteration
                call = self._call
            if self._pending:
                return self._pending.popleft()
            if call is None:
                self._connect(resuming=self._opened)
                self._opened = True
                continue
            try:
                resp = next(call)
            except StopIteration:
                # The server ended the stream without an error: the tail is over (as
                # `chorus tail -f` ends then).
                self.close()
                raise
            except grpc.RpcError as e:
                with self._lock:
                    if self._closed:
                        raise StopIteration from None
                self._lost(e)
                continue
            self._pending.extend(_record(r) for r in resp.records)
            self.next_lsn = resp.next_lsn
            if resp.records:
                self._lagging_since = None
