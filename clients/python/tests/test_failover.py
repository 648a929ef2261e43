"""Faults on a cluster of the test's own: the leader killed (SIGKILL) under appends and a
tail, and a frozen leader (SIGSTOP) that never answers."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Dict, List, Tuple

import pytest

from chorus_client import (
    ChorusError,
    Client,
    Committed,
    Failed,
    NoLeader,
    Outcome,
    Record,
    Unknown,
    Unreachable,
)
from helpers import GROUP, TailCollector, leader_node, uniq, wait_for


def whole_log(client: Client, at_least: int) -> List[Record]:
    """Every committed record, read once the answering replica's committed end is past
    `at_least`."""

    def read():
        r = client.read(GROUP, 0, max_records=1)
        return r.committed_end > at_least

    wait_for(read, 20, what=f"a committed end past {at_least}")
    return list(client.read_all(GROUP, 0))


def test_killing_the_leader_under_appends_leaves_only_explicit_outcomes(fresh_cluster):
    cl = fresh_cluster
    with Client(cl.endpoints) as probe:
        leader = leader_node(probe)
    lead_ep = cl.endpoints[leader - 1]
    others = [e for e in cl.endpoints if e != lead_ep]
    # Everyone starts at the leader (appends and the tail alike).
    eps = [lead_ep] + others

    results: List[Tuple[bytes, Outcome, float]] = []  # record, outcome, when answered
    raised: List[Tuple[List[bytes], ChorusError]] = []
    errors: List[BaseException] = []
    stop = threading.Event()
    lock = threading.Lock()

    def writer() -> None:
        with Client(eps) as c:
            while not stop.is_set():
                recs = uniq(3, "kill")
                try:
                    outs = c.append(GROUP, recs)
                except NoLeader as e:
                    # Refused whole: nothing appended (allowed while electing).
                    with lock:
                        raised.append((recs, e))
                    continue
                except BaseException as e:  # noqa: BLE001 - failed below
                    errors.append(e)
                    return
                now = time.monotonic()
                if len(outs) != len(recs):
                    errors.append(AssertionError(f"{len(outs)} outcomes for {len(recs)}"))
                    return
                with lock:
                    results.extend((r, o, now) for r, o in zip(recs, outs))

    with Client(eps) as tc:
        first = tc.append(GROUP, uniq(1, "kill-start"))[0]
        assert isinstance(first, Committed)
        tail = tc.tail(GROUP, first.lsn)
        assert tail.endpoint == lead_ep
        tailed = TailCollector(tail)
        writers = [threading.Thread(target=writer, daemon=True) for _ in range(4)]
        for w in writers:
            w.start()
        try:
            time.sleep(1.0)
            killed_at = time.monotonic()
            cl.kill(leader)
            # Appends go on at the new leader: wait for some commits after the kill.
            wait_for(
                lambda: sum(
                    1 for _, o, t in results if t > killed_at + 0.5 and isinstance(o, Committed)
                )
                >= 30,
                25,
                what="commits after the leader was killed",
            )
        finally:
            stop.set()
            for w in writers:
                w.join(30)
        assert not any(w.is_alive() for w in writers)
        assert not errors, errors

        outcomes = [o for _, o, _ in results]
        assert all(isinstance(o, (Committed, Failed, Unknown)) for o in outcomes)
        committed = [(r, o) for r, o, _ in results if isinstance(o, Committed)]
        unknown = [(r, o) for r, o, _ in results if isinstance(o, Unknown)]
        failed = [(r, o) for r, o, _ in results if isinstance(o, Failed)]

        # Read the whole log from a live node once it knows every commit.
        with Client(others) as rc:
            max_lsn = max(o.lsn for _, o in committed)
            log = whole_log(rc, max_lsn)
        by_lsn: Dict[int, Record] = {r.lsn: r for r in log}
        by_data: Dict[bytes, List[Record]] = {}
        for r in log:
            by_data.setdefault(r.data, []).append(r)
        # No record is in the log twice (nothing was retried blindly).
        dups = {d: rs for d, rs in by_data.items() if len(rs) > 1}
        assert not dups, dups
        # Every Committed record is in the log, where its outcome said.
        for data, o in committed:
            r = by_lsn.get(o.lsn)
            assert r is not None and r.data == data and r.csn == o.csn, (data, o, r)
        print(
            f"\n{len(committed)} committed, {len(failed)} failed, {len(unknown)} unknown "
            f"({sum(1 for d, _ in unknown if d in by_data)} of them in the log), "
            f"{len(raised)} appends refused whole (NoLeader)"
        )
        # A Failed record is not in the log; an Unknown one may be.
        for data, o in failed:
            assert data not in by_data, (data, o)
        for recs, _ in raised:
            assert not any(d in by_data for d in recs), recs

        # The tail, started at the leader, went on at another node from where it was:
        # it holds exactly the log from its start, no gap, no repeat.
        got = tailed.finish(max(r.lsn for r in log) + 1, timeout=30)
        assert tail.resumes >= 1 and tail.endpoint != lead_ep
        want = [r for r in log if r.lsn >= first.lsn]
        assert [(r.lsn, r.data) for r in got] == [(r.lsn, r.data) for r in want]


def test_an_append_to_a_leader_that_never_answers_is_unknown(fresh_cluster):
    cl = fresh_cluster
    with Client(cl.endpoints) as probe:
        leader = leader_node(probe)
    lead_ep = cl.endpoints[leader - 1]
    pid = cl.pid_of(leader)
    with Client([lead_ep], call_timeout=1.0) as c, Client([lead_ep], call_timeout=1.0) as tc:
        # Connected (the connections stay open while the process is frozen).
        assert isinstance(c.append(GROUP, uniq(1, "frozen-before"))[0], Committed)
        assert tc.status(GROUP)[0].ok
        recs = uniq(2, "frozen")
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            outs = c.append(GROUP, recs)
            took = time.monotonic() - started
            # A tail that cannot open there does not hang either.
            started = time.monotonic()
            with pytest.raises(Unreachable) as e:
                tc.tail(GROUP, 0)
            tail_took = time.monotonic() - started
        finally:
            os.kill(pid, signal.SIGCONT)
        assert all(isinstance(o, Unknown) for o in outs), outs
        assert "no answer within 1s" in outs[0].reason
        assert took < 5, took
        assert tail_took < 5 and "did not open within 1s" in str(e.value), (tail_took, e.value)
    # Whatever happened to them, they are in the log at most once.
    others = [e for e in cl.endpoints if e != lead_ep]
    with Client(others + [lead_ep]) as c:

        def append_one():
            try:
                return [o for o in c.append(GROUP, uniq(1, "frozen-after")) if o.committed]
            except ChorusError:
                return None

        after = wait_for(append_one, 30, what="an append after the freeze")
        log = whole_log(c, after[0].lsn)
        for d in recs:
            assert sum(1 for r in log if r.data == d) <= 1


def test_a_tail_resumed_at_a_replica_that_lags_goes_on_without_a_gap(fresh_cluster):
    # Regression (CI of 840118d): the tail read up to the dying leader's commit point,
    # resumed at a follower whose commit point was behind it, and was refused
    # OUT_OF_RANGE for good. Here the follower it resumes at was frozen while the
    # records were committed, so it surely lags.
    cl = fresh_cluster
    with Client(cl.endpoints) as probe:
        leader = leader_node(probe)
    lagging, other = [n for n in (1, 2, 3) if n != leader]
    ep = lambda n: cl.endpoints[n - 1]  # noqa: E731
    with Client([ep(leader)]) as c:
        first = c.append(GROUP, uniq(1, "lag-start"))[0]
    assert isinstance(first, Committed)
    os.kill(cl.pid_of(lagging), signal.SIGSTOP)
    try:
        # The tail resumes at the lagging replica first: the endpoint after the leader.
        with Client([ep(leader), ep(lagging), ep(other)]) as tc:
            tail = tc.tail(GROUP, first.lsn)
            tailed = TailCollector(tail)
            with Client([ep(leader)]) as c:
                before = [o for _ in range(20) for o in c.append(GROUP, uniq(5, "lag"))]
            assert all(isinstance(o, Committed) for o in before), before
            end = max(o.lsn for o in before) + 1
            wait_for(lambda: tail.next_lsn >= end, 20, what="the tail at the leader")
            cl.kill(leader)
            os.kill(cl.pid_of(lagging), signal.SIGCONT)
            with Client([ep(other), ep(lagging)]) as c:
                after: List[Outcome] = []
                deadline = time.monotonic() + 30
                while not after and time.monotonic() < deadline:
                    try:
                        after = c.append(GROUP, uniq(3, "lag-after"))
                    except NoLeader:
                        time.sleep(0.1)
            assert after and all(isinstance(o, Committed) for o in after), after
            got = tailed.finish(max(o.lsn for o in after) + 1, timeout=30)
    finally:
        os.kill(cl.pid_of(lagging), signal.SIGCONT)
    assert tail.resumes >= 1
    lsns = [r.lsn for r in got]
    assert lsns == sorted(set(lsns)), "a record repeated or out of order"
    want = [first.lsn] + [o.lsn for o in before] + [o.lsn for o in after]
    missing = set(want) - set(lsns)
    assert not missing, f"committed records the tail skipped: {sorted(missing)}"
