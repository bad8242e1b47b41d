"""The tests run against a real Spool that `tests/tests/e2e/python_client.rs` starts (the API,
workers, a fake model), which passes it in the environment: `SPOOL_URL`, `SPOOL_TOKEN` (a
user's), `SPOOL_ADMIN_TOKEN`, and what a test file needs besides (see each file)."""

import os

import pytest

from spool_client import SpoolClient


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: these tests run from the Rust test suite")
    return value


@pytest.fixture
def client():
    with SpoolClient(env("SPOOL_URL"), env("SPOOL_TOKEN")) as client:
        yield client


@pytest.fixture
def admin():
    with SpoolClient(env("SPOOL_URL"), env("SPOOL_ADMIN_TOKEN")) as client:
        yield client
