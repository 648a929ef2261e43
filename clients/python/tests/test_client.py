"""The client against a real plain-text cluster (shared by these tests)."""

from __future__ import annotations

import uuid

import pytest

from chorus_client import (
    Client,
    Committed,
    ConfigError,
    NoEndpoints,
    NoLeader,
    NotFound,
    Unreachable,
)
from helpers import (
    GROUP,
    collect_tail,
    leader_node,
    read_back,
    uniq,
    unused_endpoint,
    wait_for,
)

def test_append_outcomes_carry_lsn_and_csn_and_read_back(cluster):
    with Client(cluster.endpoints) as c:
        recs = uniq(5)
        outs = c.append(GROUP, recs)
        assert len(outs) == 5
        assert all(isinstance(o, Committed) and o.committed for o in outs), outs
        lsns = [o.lsn for o in outs]
        csns = [o.csn for o in outs]
        assert lsns == sorted(set(lsns)) and csns == sorted(set(csns)), outs
        back = read_back(c, lsns[0], 5)
        assert [(r.lsn, r.csn, r.data) for r in back] == list(zip(lsns, csns, recs))
        # A str is appended as UTF-8; ref_csn bounds the CSN from below.
        [o] = c.append(GROUP, ["héllo-" + uuid.uuid4().hex], ref_csn=csns[-1] + 1000)
        assert isinstance(o, Committed) and o.csn >= csns[-1] + 1000
        # Locate finds a record by CSN.
        assert wait_for(lambda: c.locate(GROUP, csns[2]) == lsns[2], 10, what="locate")
        # read_all goes up to the committed end.
        seen = {r.lsn: r.data for r in c.read_all(GROUP, lsns[0])}
        assert all(seen.get(lsn) == d for lsn, d in zip(lsns, recs))


def test_an_empty_append_sends_nothing(cluster):
    with Client(cluster.endpoints) as c:
        assert c.append(GROUP, []) == []


def test_the_leader_is_found_when_followers_and_a_dead_endpoint_come_first(cluster):
    with Client(cluster.endpoints) as probe:
        leader = leader_node(probe)
    lead_ep = cluster.endpoints[leader - 1]
    followers = [e for e in cluster.endpoints if e != lead_ep]
    # A dead endpoint (connection refused: nothing sent), then the followers (each answers
    # FAILED_PRECONDITION with a leader hint), then the leader.
    eps = [unused_endpoint()] + followers + [lead_ep]
    with Client(eps) as c:
        assert c.known_leader(GROUP) is None
        outs = c.append(GROUP, uniq(3))
        assert all(isinstance(o, Committed) for o in outs), outs
        assert c.known_leader(GROUP) == lead_ep
        # The next append goes to the leader it remembers.
        outs = c.append(GROUP, uniq(2))
        assert all(isinstance(o, Committed) for o in outs), outs
        assert c.known_leader(GROUP) == lead_ep
    # Only followers and nothing else: no leader, raised (nothing was appended).
    with Client(followers, leader_timeout=0.5) as c:
        with pytest.raises(NoLeader) as e:
            c.append(GROUP, uniq(1))
        assert "not the leader" in str(e.value)


def test_status_names_every_node_and_one_leader(cluster):
    with Client(cluster.endpoints + [unused_endpoint()]) as c:
        st = c.status(GROUP)
        assert [s.endpoint for s in st] == c.endpoints
        assert sorted(s.node for s in st[:3]) == [1, 2, 3]
        assert not st[3].ok and isinstance(st[3].error, Unreachable)
        roles = sorted(s.group(GROUP).role for s in st[:3])
        assert roles.count("leader") == 1, roles
        assert c.leader(GROUP).node in (1, 2, 3)


def test_tail_yields_what_is_appended(cluster):
    with Client(cluster.endpoints) as c:
        first = c.append(GROUP, uniq(2, "tail-start"))
        start = first[0].lsn
        tail = c.tail(GROUP, start)
        more = c.append(GROUP, uniq(4, "tail-more"))
        assert all(isinstance(o, Committed) for o in first + more)
        end = max(o.lsn for o in more) + 1
        got = collect_tail(tail, end)
        want = {o.lsn: o.csn for o in first + more}
        tailed = {r.lsn: r.csn for r in got}
        assert all(tailed.get(lsn) == csn for lsn, csn in want.items()), (want, tailed)
        lsns = [r.lsn for r in got]
        assert lsns == sorted(set(lsns)) and lsns[0] == start
        # The history from the start of the log is there too.
        t0 = c.tail(GROUP, 0)
        it = iter(t0)
        r0 = next(it)
        assert r0.lsn > 0 and r0.data
        t0.close()
        assert list(t0) == []


def test_errors_are_typed(cluster):
    with pytest.raises(NoEndpoints):
        Client([])
    with pytest.raises(ConfigError):
        Client(["ftp://127.0.0.1:1"])
    with pytest.raises(ConfigError):
        Client(["no spaces:1"])
    with pytest.raises(ConfigError):
        Client(cluster.endpoints, token="bad token")
    with pytest.raises(ConfigError):
        Client(cluster.endpoints, ca=b"not pem")
    with Client(cluster.endpoints) as c:
        with pytest.raises(NotFound):
            c.read(4242, 0)
        with pytest.raises(NotFound):
            c.append(4242, [b"x"])
    dead = [unused_endpoint(), unused_endpoint()]
    with Client(dead, leader_timeout=0.3) as c:
        with pytest.raises(NoLeader):
            c.append(GROUP, [b"x"])
        with pytest.raises(Unreachable):
            c.read(GROUP, 0)
