"""Helpers of the tests. Real local clusters: `chorus dev --detach` on free loopback
ports, in a temporary directory, stopped (every node pid in DIR/pids) when its fixture
ends.

The server binary is $CHORUS_BIN, by default ../../target/debug/chorus from this
package (build it with `cargo build -p chorus-server --bin chorus`). Without it the tests
fail: nothing here skips.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from chorus_client import Record

HERE = Path(__file__).resolve().parent
DEFAULT_BIN = (HERE / ".." / ".." / ".." / "target" / "debug" / "chorus").resolve()


def chorus_bin() -> Path:
    p = Path(os.environ.get("CHORUS_BIN") or DEFAULT_BIN)
    if not p.is_file() or not os.access(p, os.X_OK):
        pytest.fail(
            f"no chorus binary at {p}: build it (cargo build -p chorus-server --bin chorus) "
            "or set CHORUS_BIN",
            pytrace=False,
        )
    return p


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port(nodes: int) -> int:
    """A base port in 20000-40000 whose API (base+i), replication (base+100+i) and
    metrics (base+200+i) ports are all free."""
    rng = random.Random(os.getpid() ^ time.time_ns())
    for _ in range(200):
        base = rng.randrange(20000, 39700, 10)
        ports = [base + off + i for off in (0, 100, 200) for i in range(1, nodes + 1)]
        if all(_port_free(p) for p in ports):
            return base
    raise RuntimeError("no free base port found in 20000-40000")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


@dataclass
class Cluster:
    """A running `chorus dev` cluster."""

    dir: Path
    endpoints: List[str]
    pids: List[int]
    tls: bool = False
    killed: List[int] = field(default_factory=list)

    @property
    def tls_dir(self) -> Path:
        return self.dir / "tls"

    @property
    def token(self) -> str:
        return (self.tls_dir / "operator.token").read_text().strip()

    def tls_kwargs(self) -> Dict[str, object]:
        """What a client needs for this secured cluster (the names `chorus dev --tls`
        writes: ca.pem, client.pem, client.key, operator.token; certificates name
        localhost)."""
        t = self.tls_dir
        return dict(
            ca=t / "ca.pem",
            cert=t / "client.pem",
            key=t / "client.key",
            tls_name="localhost",
            token=self.token,
        )

    def pid_of(self, node: int) -> int:
        # DIR/pids lists the nodes' pids in node order (1, 2, ...).
        return self.pids[node - 1]

    def kill(self, node: int) -> None:
        """SIGKILL node `node` (1-based)."""
        pid = self.pid_of(node)
        os.kill(pid, signal.SIGKILL)
        self.killed.append(node)
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)

    def logs(self) -> str:
        out = []
        for p in sorted(self.dir.glob("n*.log")):
            text = re.sub(r"\x1b\[[0-9;]*m", "", p.read_text(errors="replace"))
            lines = text.splitlines()[-15:]
            out.append(f"--- {p.name} (last lines)\n" + "\n".join(lines))
        return "\n".join(out)

    def stop(self) -> None:
        """SIGTERM every node, then SIGKILL whatever is still alive after 5 s."""
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in self.pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in self.pids:
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def start_cluster(dir: Path, *, tls: bool = False, nodes: int = 3, fresh: bool = True) -> Cluster:
    """Starts `chorus dev --detach` in `dir` (a few tries, on other ports, if it does not
    come up): with `fresh`, `--fresh` (the directory is emptied first); without, what
    is in `dir` (DIR/tls certificates) is kept and only the nodes' data is removed
    between tries."""
    binary = chorus_bin()
    last = ""
    for _attempt in range(3):
        base = free_base_port(nodes)
        args = [
            str(binary),
            "dev",
            "--detach",
            "--dir",
            str(dir),
            "--base-port",
            str(base),
            "--nodes",
            str(nodes),
        ]
        if tls:
            args.append("--tls")
        if fresh:
            args.append("--fresh")
        try:
            p = subprocess.run(
                args, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=90
            )
        except subprocess.TimeoutExpired as e:
            last = f"timed out: {e}"
            p = None
        pids_file = dir / "pids"
        pids = [int(x) for x in pids_file.read_text().split()] if pids_file.exists() else []
        if p is not None and p.returncode == 0 and pids:
            endpoints = re.findall(r"api (https?://\S+)", p.stdout)
            assert len(endpoints) == nodes, p.stdout
            return Cluster(dir=dir, endpoints=endpoints, pids=pids, tls=tls)
        # Clean up whatever started, and try again elsewhere.
        Cluster(dir=dir, endpoints=[], pids=pids).stop()
        for i in range(1, nodes + 1):
            shutil.rmtree(dir / f"n{i}", ignore_errors=True)
        if p is not None:
            last = f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    raise RuntimeError(f"chorus dev did not start: {last}")


def wait_for(cond, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):
    """Polls `cond()` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def leader_node(client, group: int = 1, timeout: float = 10.0) -> int:
    s = wait_for(lambda: client.leader(group), timeout, what="a leader")
    return s.node


def unused_endpoint() -> Optional[str]:
    """An address nothing listens on (connection refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


#: The group `chorus dev` creates.
GROUP = 1


def uniq(n: int, tag: str = "r") -> List[bytes]:
    u = uuid.uuid4().hex[:12]
    return [f"{tag}-{u}-{i}".encode() for i in range(n)]


def read_back(client, from_lsn: int, n: int) -> List[Record]:
    """`n` records from `from_lsn` (waiting for the answering replica to know them
    committed: a follower learns the commit point a moment after the leader)."""

    def got():
        recs = client.read(GROUP, from_lsn, max_records=n).records
        return recs if len(recs) >= n else None

    return wait_for(got, 10, what=f"{n} records from LSN {from_lsn}")[:n]


class TailCollector:
    """Iterates a tail in a thread of its own, from now on, collecting its records."""

    def __init__(self, tail) -> None:
        self.tail = tail
        self.got: List[Record] = []
        self.errors: List[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for r in self.tail:
                self.got.append(r)
        except BaseException as e:  # noqa: BLE001 - raised by finish()
            self.errors.append(e)

    def finish(self, until_lsn: int, timeout: float = 20.0) -> List[Record]:
        """Waits until the tail has yielded every record below `until_lsn`, stops it and
        returns what it yielded."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.errors:
            if self.got and self.got[-1].lsn >= until_lsn - 1 and not self.tail._pending:
                break
            if self.tail.next_lsn >= until_lsn and not self.tail._pending:
                break
            time.sleep(0.02)
        self.tail.close()
        self._thread.join(5)
        assert not self._thread.is_alive(), "the tail did not stop when closed"
        if self.errors:
            raise self.errors[0]
        assert self.tail.next_lsn >= until_lsn, (
            f"tail reached {self.tail.next_lsn}, not {until_lsn}"
        )
        return list(self.got)


def collect_tail(tail, until_lsn: int, timeout: float = 20.0) -> List[Record]:
    """Iterates `tail` in a thread until its position reaches `until_lsn`."""
    return TailCollector(tail).finish(until_lsn, timeout)


def write_tls_files(dir: Path, nodes: int = 3) -> Path:
    """Writes DIR/tls as `chorus dev --tls` lays it out (ca.pem and ca.key, node<i>.pem
    and .key, client.pem and .key, every certificate naming localhost), made with the
    openssl CLI, each certificate with a subject of its own (the CA's is not its
    subjects'). `chorus dev --tls` keeps files that are there and adds operator.token.

    Why not the files `chorus dev --tls` makes itself: they all carry the subject
    `CN=rcgen self signed cert`, the CA's, so OpenSSL and BoringSSL (gRPC's, so Python's)
    take a node's certificate for a self-signed one and refuse it (see
    test_tls.py::test_chorus_dev_tls_certificates_verify_with_boringssl).
    """
    if shutil.which("openssl") is None:
        pytest.fail("the openssl CLI is needed to make test certificates (apt-get install openssl)")
    t = dir / "tls"
    t.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        p = subprocess.run(["openssl", *args], cwd=t, capture_output=True, text=True)
        assert p.returncode == 0, f"openssl {' '.join(args)}: {p.stderr}"

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "30",
        "-subj", "/CN=chorus test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )
    ext = t / "leaf.ext"
    ext.write_text(
        "subjectAltName=DNS:localhost\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
    )
    for name in [f"node{i}" for i in range(1, nodes + 1)] + ["client"]:
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=chorus test {name}")
        run(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "30", "-extfile", str(ext),
        )
    return t
