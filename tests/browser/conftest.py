"""Browser tests: the real ASGI server (uvicorn: HTTP + WebSocket) on the test database,
driven by Playwright in Debian's Chromium."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from tests.conftest import sim_container_label
from tests.ports import port_in_log

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def _log_dir() -> Path:
    """VAR_DIR, made here: a browser test run alone must not rely on another test making it."""
    path = Path(os.environ["VAR_DIR"])
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def live_server_url(django_db_setup, django_db_blocker):
    """uvicorn serving marketplace.asgi on the test database (data must be committed)."""
    with django_db_blocker.unblock():
        database = connection.settings_dict["NAME"]
    base = os.environ["DATABASE_URL"].rsplit("/", 1)[0]
    # Tasks go to the real worker (celery_worker fixture), not run inline in the web process.
    env = {
        **os.environ,
        "DATABASE_URL": f"{base}/{database}",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "CELERY_TASK_ALWAYS_EAGER": "0",
        # Its containers carry the test label too, so each test's clean-up removes them.
        "CONTAINER_EXTRA_LABELS": sim_container_label(),
        "PGAPPNAME": "test-live-server",  # names its sessions in pg_stat_activity
    }
    log_path = _log_dir() / f"uvicorn-{os.getpid()}.log"
    log = open(log_path, "wb")  # noqa: SIM115
    # Port 0: the OS hands uvicorn a free port, and uvicorn's start-up line names it.
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "marketplace.asgi:application", "--host", "127.0.0.1",
         "--port", "0", "--log-level", "info", "--no-access-log"],
        cwd=ROOT, env=env, stdout=log, stderr=log,
    )  # fmt: skip
    port = port_in_log(log_path, r"Uvicorn running on http://127\.0\.0\.1:(\d+)", server)
    yield f"http://127.0.0.1:{port}"
    server.terminate()
    server.wait(timeout=10)
    log.close()


@pytest.fixture(scope="package")
def browser():
    """Chromium for the browser tests only. Playwright's sync API keeps an event loop running
    on this thread while it is started, so it is stopped when these tests are done: an async
    test that the same xdist worker runs later needs the thread without one."""
    from playwright.sync_api import sync_playwright

    # The tests' own ORM calls are still plain synchronous code while that loop runs, so
    # Django's async guard would misfire.
    unsafe_before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: make test installs Debian's chromium package")
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if unsafe_before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = unsafe_before


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(20_000)
    yield page
    context.close()


@pytest.fixture
def celery_worker(live_server_url, django_db_blocker):
    """A real Celery worker on the test database and this worker's Redis, for one test.

    It ends with the test, before the database is flushed: a worker kept for the session went
    on running the last test's tasks (a stop's rentals being destroyed over SSH) while the
    flush's TRUNCATE took its locks, and the two deadlocked. Its warm shutdown lets the tasks
    it runs finish; what is still queued (a retry's countdown) is purged, so nothing of this
    test runs in the next. ``tests/conftest.py`` then waits for the database to be quiet."""
    with django_db_blocker.unblock():
        database = connection.settings_dict["NAME"]
    base = os.environ["DATABASE_URL"].rsplit("/", 1)[0]
    env = {
        **os.environ,
        "DATABASE_URL": f"{base}/{database}",
        "CELERY_TASK_ALWAYS_EAGER": "0",
        # Its containers carry the test label too, so each test's clean-up removes them.
        "CONTAINER_EXTRA_LABELS": sim_container_label(),
        "PGAPPNAME": "test-celery-worker",  # names its sessions in pg_stat_activity
    }
    log = open(_log_dir() / "celery-worker.log", "ab")  # noqa: SIM115
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "marketplace", "worker", "--pool", "threads",
         "--concurrency", "4", "--loglevel", "info", "--without-mingle", "--without-gossip"],
        cwd=ROOT, env=env, stdout=log, stderr=log,
    )  # fmt: skip
    yield worker
    worker.terminate()  # warm shutdown: running tasks finish, unstarted ones go back to Redis
    try:
        worker.wait(timeout=90)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(timeout=10)
    log.close()
    from marketplace.celery import app

    app.control.purge()


# The renting fixtures (provider team, container clean-up) are shared with the marketplace tests.
from tests.marketplace.conftest import _label_test_containers, provider_team  # noqa: E402, F401
