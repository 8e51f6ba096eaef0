"""Fixtures of the store tests: a private cache directory, and each store kind over it."""

import os

import pytest

from fusedattn_select.store import MemoryStore, PersistentStore


@pytest.fixture
def cache_dir(tmp_path):
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    os.chmod(directory, 0o700)
    return directory


@pytest.fixture(params=["sqlite", "memory"])
def store(request, cache_dir):
    if request.param == "sqlite":
        return PersistentStore(cache_dir)
    return MemoryStore()
