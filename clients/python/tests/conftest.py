"""Fixtures: real local clusters (`chorus dev --detach`), stopped when they end (see
helpers.py). Nothing skips: a skipped test fails the run."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import List

import pytest

from helpers import Cluster, start_cluster, write_tls_files


def _cluster_fixture(
    request: pytest.FixtureRequest, tls: bool, own_certs: bool = False
) -> Cluster:
    d = Path(tempfile.mkdtemp(prefix="chorus-pytest-"))
    try:
        if own_certs:
            write_tls_files(d)
        c = start_cluster(d, tls=tls, fresh=not own_certs)
    except BaseException:
        shutil.rmtree(d, ignore_errors=True)
        raise

    def fin() -> None:
        c.stop()
        if request.session.testsfailed:
            print(f"\ncluster {d} logs:\n{c.logs()}")
        shutil.rmtree(d, ignore_errors=True)

    request.addfinalizer(fin)
    return c


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Cluster:
    """A plain 3-node cluster shared by the tests that do not break it."""
    return _cluster_fixture(request, tls=False)


@pytest.fixture(scope="session")
def tls_cluster(request: pytest.FixtureRequest) -> Cluster:
    """A secured 3-node cluster (`chorus dev --tls`: mutual TLS, the operator token
    required), on certificates of the tests' own in DIR/tls (helpers.write_tls_files
    says why)."""
    return _cluster_fixture(request, tls=True, own_certs=True)


@pytest.fixture
def dev_tls_cluster(request: pytest.FixtureRequest) -> Cluster:
    """A secured cluster on the certificates `chorus dev --tls` makes itself."""
    return _cluster_fixture(request, tls=True)


@pytest.fixture
def fresh_cluster(request: pytest.FixtureRequest) -> Cluster:
    """A plain 3-node cluster of the test's own (for tests that kill nodes)."""
    return _cluster_fixture(request, tls=False)


# Nothing may skip silently: a skipped test fails the run.
_skipped: List[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # An expected failure (xfail, reported in the summary) is not a skip.
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped and session.exitstatus == 0:
        print(f"\nskipped tests are not allowed here: {_skipped}")
        session.exitstatus = 1


