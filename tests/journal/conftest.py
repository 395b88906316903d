"""Fixtures for journal tests."""

import pytest


@pytest.fixture
def jdir(tmp_path):
    return str(tmp_path / "journal")
