"""Test environment defaults, loaded as a plugin (-p tests.environment) before Django settings.

Each xdist worker gets its own Redis database and key prefixes, so channel groups, caches and
Celery queues of parallel workers never meet. ``TEST_NAMESPACE`` (0-9, default 0) separates
whole concurrent pytest runs on one machine: databases, Redis, simulated host addresses/ports.
"""

from __future__ import annotations

import os

worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
worker_index = int(worker.removeprefix("gw") or 0)
namespace = int(os.environ.get("TEST_NAMESPACE", "0"))
if not 0 <= namespace <= 9:
    # Simulated hosts' ports are 23000 + 1000 × namespace and up: from 10 on they fall in
    # Linux's ephemeral range, where any outgoing connection may hold them first.
    raise SystemExit(f"TEST_NAMESPACE must be 0-9 (got {namespace}): higher ones collide")
tag = f"ns{namespace}-{worker}"

os.environ.setdefault("SECRET_KEY", "test-secret-key-not-for-production-" + "x" * 20)
os.environ.setdefault("HTTPS_ONLY", "0")
os.environ.setdefault("ALLOWED_HOSTS", "testserver,localhost,127.0.0.1")
database = "gpumkt" if namespace == 0 else f"gpumkt_ns{namespace}"
os.environ.setdefault("DATABASE_URL", f"postgres://gpumkt:gpumkt@127.0.0.1:5432/{database}")
redis_base = os.environ.get("REDIS_URL", "redis://127.0.0.1:6391/0").rsplit("/", 1)[0]
os.environ["REDIS_URL"] = f"{redis_base}/{(namespace * 4 + worker_index) % 16}"
os.environ["CHANNEL_PREFIX"] = f"gpumkt-test-{tag}"
os.environ["CACHE_KEY_PREFIX"] = f"gpumkt-test-{tag}"
# Namespaces share Redis's 16 databases (namespace 4's gw0 is namespace 0's gw0): the broker's
# keys are prefixed too, so no run consumes or purges another's tasks.
os.environ["BROKER_KEY_PREFIX"] = f"gpumkt-test-{tag}:"
os.environ.setdefault("CELERY_TASK_ALWAYS_EAGER", "1")
# Set, not defaulted: xdist workers inherit the controller's environment, so a default set
# there (tagged gw0) would make every worker share one folder and one platform key file.
os.environ["VAR_DIR"] = f"/tmp/gpumkt-test-{tag}"
os.environ["PLATFORM_SSH_KEY_PATH"] = f"/tmp/gpumkt-test-{tag}/platform_ssh_key"
os.environ.setdefault("WHITENOISE_USE_FINDERS", "1")
os.environ.setdefault("HOST_ALLOW_LOOPBACK", "1")  # simulated hosts are sshd on 127.x
