"""Shared fixtures. `postgres_url`: a fresh, empty PostgreSQL database for one test.

The server comes from AUTOTUNE_TEST_POSTGRES, a libpq URL of a database the tests may create
databases from, such as postgresql://postgres@127.0.0.1:55432/postgres. `bash scripts/test.sh`
starts a throwaway server and sets it; to use a server of your own, set it yourself.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

POSTGRES_ENV = "AUTOTUNE_TEST_POSTGRES"
# The probe's time cap is wall-clock time, which a busy machine spends faster: no test's figures
# may hang on it (those of the cap itself set their own). Child processes inherit it.
os.environ.setdefault("AUTOTUNE_PROBE_SECONDS", "3600")


def _server_url() -> str:
    """The server's URL; skips the test without one, except in CI, which must run it."""
    url = os.environ.get(POSTGRES_ENV, "")
    if not url:
        why = (
            f"{POSTGRES_ENV} is not set: run the tests with `bash scripts/test.sh`, which starts a "
            "PostgreSQL server"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(
                f"CI=true and {why}; CI must run the PostgreSQL tests, not skip them", pytrace=False
            )
        pytest.skip(why)
    # libpq does not know SQLAlchemy's driver suffixes (postgresql+psycopg://).
    return "postgresql://" + url.split("://", 1)[1]


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A plain postgresql:// URL of a new database, as a user would write it (SQLAlchemy 2.1 opens
    it with psycopg 3, a dependency of autotune); the database is dropped after the test."""
    import psycopg

    server = _server_url()
    name = f"autotune_test_{uuid.uuid4().hex[:12]}"
    # CREATE/DROP DATABASE cannot run in a transaction
    admin = psycopg.connect(server, autocommit=True)
    try:
        with admin.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{name}"')
        yield urlunsplit(urlsplit(server)._replace(path=f"/{name}"))
        with admin.cursor() as cursor:
            # FORCE (PostgreSQL 13+): ends connections a test left open, e.g. an engine's pool.
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.close()


@pytest.fixture(autouse=True)
def _ctrl_c_handled() -> None:
    """Each test starts with Ctrl-C handled as Python handles it. A run stopped by a signal in an
    earlier test ignores SIGINT from then on (signals.stopping), as does a suite started as a
    background job of a shell without job control; every process a test starts would inherit
    "ignored" and run on through the Ctrl-C that a test sends it. A handler is not inherited."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
