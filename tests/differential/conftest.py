"""The differential tests' oracles: etcd 3.4, 3.6 and 3.7.

``oracle_factory(version)`` starts a fresh etcd of that version (3.7 comes
from tests.support.etcd_tools; 3.4 and 3.6 as tests/conftest.py's
etcd_factory starts them) and stops every one it started at teardown.
"""

from __future__ import annotations

import pytest

from tests.support.etcd_tools import require_oracle, start_oracle


@pytest.fixture
def oracle_factory():
    started = []

    def make(version: str = "3.4", **kw):
        require_oracle(version)
        srv = start_oracle(version, **kw)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.cleanup()
