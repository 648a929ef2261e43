"""The client against a secured cluster (`chorus dev --tls`: mutual TLS on the API, the
operator's bearer token required), on certificates the tests make (helpers.write_tls_files
says why), and on those `chorus dev --tls` makes (an expected failure, for now)."""

from __future__ import annotations

import pytest

from chorus_client import (
    Client,
    Committed,
    NoLeader,
    Unauthenticated,
)
from helpers import GROUP, collect_tail, read_back, uniq


def test_tls_with_a_token_appends_reads_and_tails(tls_cluster):
    assert all(e.startswith("https://") for e in tls_cluster.endpoints)
    with Client(tls_cluster.endpoints, **tls_cluster.tls_kwargs()) as c:
        recs = uniq(3, "tls")
        outs = c.append(GROUP, recs)
        assert all(isinstance(o, Committed) for o in outs), outs
        back = read_back(c, outs[0].lsn, 3)
        assert [r.data for r in back] == recs
        tail = c.tail(GROUP, outs[0].lsn)
        got = collect_tail(tail, outs[-1].lsn + 1)
        assert [r.data for r in got[:3]] == recs
        assert sorted(s.node for s in c.status()) == [1, 2, 3]


def test_the_ca_and_key_may_be_given_as_bytes(tls_cluster):
    kw = tls_cluster.tls_kwargs()
    for k in ("ca", "cert", "key"):
        kw[k] = kw[k].read_bytes()
    with Client(tls_cluster.endpoints, **kw) as c:
        assert all(isinstance(o, Committed) for o in c.append(GROUP, uniq(1, "bytes")))


def test_without_a_token_every_call_is_unauthenticated(tls_cluster):
    kw = tls_cluster.tls_kwargs()
    del kw["token"]
    with Client(tls_cluster.endpoints, **kw) as c:
        with pytest.raises(Unauthenticated) as e:
            c.append(GROUP, [b"never"])
        assert "bearer token" in e.value.details
        with pytest.raises(Unauthenticated):
            c.read(GROUP, 0)
        with pytest.raises(Unauthenticated):
            c.locate(GROUP, 1)
        with pytest.raises(Unauthenticated):
            next(iter(c.tail(GROUP, 0)))
        st = c.status(GROUP)
        assert all(isinstance(s.error, Unauthenticated) for s in st), st


def test_a_wrong_token_is_unauthenticated(tls_cluster):
    kw = tls_cluster.tls_kwargs()
    kw["token"] = "0123456789abcdef0123456789abcdef-wrong"
    with Client(tls_cluster.endpoints, **kw) as c:
        with pytest.raises(Unauthenticated) as e:
            c.append(GROUP, [b"never"])
        assert "not one of this node's identities" in e.value.details


def test_plain_text_to_a_tls_cluster_connects_nowhere(tls_cluster):
    plain = [e.replace("https://", "http://") for e in tls_cluster.endpoints]
    with Client(plain, token=tls_cluster.token, leader_timeout=0.5) as c:
        with pytest.raises(NoLeader):
            c.append(GROUP, [b"never"])


def test_from_env_reads_what_chorus_dev_prints(tls_cluster, monkeypatch):
    kw = tls_cluster.tls_kwargs()
    monkeypatch.setenv("CHORUS_ENDPOINTS", ",".join(tls_cluster.endpoints))
    monkeypatch.setenv("CHORUS_CA", str(kw["ca"]))
    monkeypatch.setenv("CHORUS_CERT", str(kw["cert"]))
    monkeypatch.setenv("CHORUS_KEY", str(kw["key"]))
    monkeypatch.setenv("CHORUS_TLS_NAME", "localhost")
    monkeypatch.setenv("CHORUS_TOKEN", tls_cluster.token)
    with Client.from_env() as c:
        assert all(isinstance(o, Committed) for o in c.append(GROUP, uniq(1, "env")))


# chorus dev --tls names each certificate's subject (the CA's differs from every leaf's):
# BoringSSL, unlike rustls, refuses a leaf whose subject is its issuer's.
def test_chorus_dev_tls_certificates_verify_with_boringssl(dev_tls_cluster):
    with Client(
        dev_tls_cluster.endpoints, leader_timeout=1.0, **dev_tls_cluster.tls_kwargs()
    ) as c:
        assert all(isinstance(o, Committed) for o in c.append(GROUP, uniq(1, "devtls")))
