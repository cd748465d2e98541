"""Settings, read from the environment.

The embedded default (``make run``) is DEBUG with SQLite and a local Redis; production sets
``DATABASE_URL``, ``REDIS_URL``, ``SECRET_KEY`` and ``ALLOWED_HOSTS``. With DEBUG off the
settings refuse to start without a real secret key and turn on every HTTPS protection, so that
``manage.py check --deploy --fail-level WARNING`` passes (tests/test_settings.py proves it).
"""

from __future__ import annotations

import importlib
import logging
import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def development_secret_key() -> str:
    """A per-checkout key kept in var/, so sessions survive restarts of ``make run``."""
    path = VAR_DIR / "secret_key"
    if not path.exists():
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


DEBUG = env_bool("DEBUG", False)

SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off.")
    SECRET_KEY = development_secret_key()
# Retired keys, newest first, while a rotation settles: sessions, signed values and the
# registry passwords sealed under them stay readable (comma-separated in the environment).
SECRET_KEY_FALLBACKS = env_list("SECRET_KEY_FALLBACKS")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]" if DEBUG else "")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")
CSRF_FAILURE_VIEW = "marketplace.api.errors.csrf_failure"  # the error shape under /api/

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "axes",
    "django_structlog",
    "marketplace",
    "scheduler",
    "hosts",
    "billing",
]

MIDDLEWARE = [
    # The cluster gateway's forward-auth sub-requests (one per request to a cluster's URL),
    # answered before everything else; the gateway measures them (marketplace/clusters/).
    "marketplace.clusters.auth.GatewayAuthMiddleware",
    # First and last: django-prometheus times the whole chain and counts each answer by the
    # URL pattern's name (never the raw path, which would make a series per id).
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "marketplace.tenancy.ActiveTeamMiddleware",
    # A request id (and the user and team) on every log line of the request, and on the
    # tasks it queues (marketplace/observability/logs.py).
    "django_structlog.middlewares.RequestMiddleware",
    "marketplace.observability.logs.LogContextMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last but one, as django-axes asks: it turns a locked-out log-in into the lockout page.
    "axes.middleware.AxesMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "marketplace.urls"
ASGI_APPLICATION = "marketplace.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "marketplace.tenancy.team_context",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'marketplace.sqlite3'}")
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and env_bool("DB_POOL", True):
    # Django's advice for ASGI: no persistent connections (a connection belongs to the thread
    # that served one request, and there are many such threads), and psycopg's pool instead.
    # Each process has its own pool, made at its first query (so a Celery child that forks
    # before any query never shares a parent's). DB_POOL=0 behind an external pooler.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # The pool checks a connection before handing it out. Without it, after PostgreSQL
    # restarts every pooled connection is dead, and each process fails one request or task per
    # connection it kept (the first metering sweep after an outage among them). core.postgresql
    # checks without a round trip where the socket says the connection is alive;
    # DB_POOL_QUIET_CHECK=0: Django's check, one empty query per checkout.
    if env_bool("DB_POOL_QUIET_CHECK", True):
        DATABASES["default"]["ENGINE"] = "core.postgresql"
    else:
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    DATABASES["default"]["OPTIONS"] = {
        "pool": {
            "min_size": int(os.environ.get("DB_POOL_MIN", "1")),
            "max_size": int(os.environ.get("DB_POOL_MAX", "20")),
            "timeout": 20,
        },
        # Statements run often through a server-binding cursor (core.db.prepared_cursor: the
        # API key lookup, the offer index's check before each search) are prepared on each
        # pooled connection after 5 runs. Django's own cursors bind on the client and never
        # prepare. Not behind an external pooler (DB_POOL=0): it may hand a statement to a
        # connection that never prepared it.
        "prepare_threshold": 5,
    }
elif DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The embedded default: web, worker and beat write to one file. WAL lets readers go on
    # while one process writes; IMMEDIATE takes the write lock when a transaction begins, so
    # two writers queue for it (up to the timeout) instead of one failing at its first write
    # with "database is locked" (a deferred transaction cannot wait for a lock it upgrades to).
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": (
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=30000;"
        ),
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_USER_MODEL = "marketplace.User"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# django-axes counts failed password log-ins (console and admin) and refuses a user name from
# one address after LOGIN_FAILURE_LIMIT failures, even with the right password, until the
# lockout ends. Its backend goes first so it sees each attempt; the model backend logs in.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = int(os.environ.get("LOGIN_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=int(os.environ.get("LOGIN_LOCKOUT_MINUTES", "15")))
# User name and address together: a stranger cannot lock a user out from elsewhere, and one
# address cannot guess one user's password on and on.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "marketplace.views.accounts.login_locked_out"
# The address is the peer's, never a client-set header (a forged X-Forwarded-For would dodge
# the lockout), except behind our own proxy, whose one hop is trusted.
AXES_IPWARE_META_PRECEDENCE_ORDER = (
    ["HTTP_X_FORWARDED_FOR", "REMOTE_ADDR"] if env_bool("BEHIND_PROXY", False) else ["REMOTE_ADDR"]
)
AXES_IPWARE_PROXY_COUNT = 1 if env_bool("BEHIND_PROXY", False) else None

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "console-home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", BASE_DIR / "var" / "staticfiles"))
# Serve straight from static/ when files were not collected (development, tests).
WHITENOISE_USE_FINDERS = env_bool("WHITENOISE_USE_FINDERS", DEBUG)

# --- Redis: Celery broker, cache, channel layer --------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6390/0")

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": os.environ.get("CACHE_KEY_PREFIX", "gpumkt"),
    }
}

CHANNEL_LAYERS = {
    "default": {
        # channels_redis's, telling at once which groups have listeners (core/channel_layer.py).
        "BACKEND": "core.channel_layer.RedisChannelLayer",
        "CONFIG": {
            "hosts": [REDIS_URL],
            "prefix": os.environ.get("CHANNEL_PREFIX", "gpumkt"),
            "capacity": 1000,
            "expiry": 30,
        },
    }
}

# --- Celery -------------------------------------------------------------------------------
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
# One (disabled) result backend for all threads. Celery otherwise makes one per thread, and
# making one scans the installed packages' entry points (a noticeable share of a rent's CPU,
# figures in docs/benchmarks.md); a web process serves
# each request in a fresh thread, so every task a request queued (a rent's launch) paid it.
CELERY_RESULT_BACKEND_THREAD_SAFE = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
# Our tasks are idempotent (keyed on ids, claim work with conditional updates), so a task is
# acknowledged only after it ran and re-queued if its worker died mid-way.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Redis re-delivers an unacked message after the visibility timeout; it must be longer than
# any countdown/eta we schedule, or a delayed task would run twice.
# A connection attempt to an unreachable Redis gives up after 5 s instead of the kernel's
# minutes of SYN retries, so the reconnect loop below keeps its pace.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 6 * 60 * 60, "socket_connect_timeout": 5}
# After Redis went away a worker tries again every BROKER_RETRY_MAX_SECONDS at most (Celery's
# own backoff grows to 30 s, so a worker could idle 30 s after Redis is back) and never gives
# up (Celery's 100 tries would end it in a long outage): marketplace/broker_reconnect.py.
# BROKER_KEY_PREFIX puts every broker key under a prefix, so installations (or concurrent test
# runs, tests/environment.py) can share one Redis database without sharing a queue.
if os.environ.get("BROKER_KEY_PREFIX"):
    CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] = os.environ["BROKER_KEY_PREFIX"]
CELERY_WORKER_CONSUMER = "marketplace.broker_reconnect:BrokerConsumer"
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
BROKER_RETRY_MAX_SECONDS = 2
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
# Each room keeps its periodic tasks in <room>/schedule.py (plain data, safe to import here).
CELERY_BEAT_SCHEDULE: dict[str, dict] = {
    "expire-invitations": {
        "task": "marketplace.tasks.invitations_expire",
        "schedule": timedelta(hours=1),
    },
    "metering-sweep": {
        "task": "marketplace.tasks.metering_sweep",
        "schedule": timedelta(seconds=60),
    },
    "expiry-sweep": {"task": "marketplace.tasks.expiry_sweep", "schedule": timedelta(seconds=30)},
    # Interrupted rentals win their GPUs back as soon as a change frees them; this catches
    # one whose start failed or whose event was lost.
    "bids-resolve": {"task": "marketplace.tasks.bids_resolve", "schedule": timedelta(seconds=60)},
    "offers-refresh": {
        "task": "marketplace.tasks.offers_refresh",
        "schedule": timedelta(minutes=5),
    },
    "deployments-sweep": {
        "task": "marketplace.tasks.deployments_sweep",
        "schedule": timedelta(seconds=10),
    },
    "clusters-tick": {"task": "marketplace.tasks.clusters_tick", "schedule": timedelta(seconds=5)},
    "gateway-routes": {
        "task": "marketplace.tasks.gateway_routes_write",
        "schedule": timedelta(seconds=30),
    },
    **importlib.import_module("hosts.schedule").BEAT_SCHEDULE,
    **importlib.import_module("scheduler.schedule").BEAT_SCHEDULE,
    **importlib.import_module("billing.schedule").BEAT_SCHEDULE,
}

# The cluster gateway (Caddy): its admin API (no gateway when empty), the base of the URLs
# users call, and where it reaches the web servers for forward-auth.
GATEWAY_ADMIN = os.environ.get("GATEWAY_ADMIN", "")
GATEWAY_URL = os.environ.get("GATEWAY_URL", "")
GATEWAY_AUTH_UPSTREAM = os.environ.get("GATEWAY_AUTH_UPSTREAM", "127.0.0.1:8000")
# The Caddy server the clusters' routes go in front of: "gateway" where gateway_load made the
# config (make run, tests); "srv0" behind the production Caddyfile (its one site).
GATEWAY_SERVER = os.environ.get("GATEWAY_SERVER", "gateway")


# Where the gateway's server listens when it shares a Caddy with other sites (production: the
# front proxy, deploy/Caddyfile, which hands /clusters/* to it). Set, every route push first
# puts the server back if Caddy was restarted or reloaded and lost it (make run sets it to its
# gateway's port); empty, it is never added.
GATEWAY_LISTEN = os.environ.get("GATEWAY_LISTEN", "")
# How long the gateway's auth answers are remembered per credential: a revoked key or a
# removed member stops working within this many seconds.
GATEWAY_AUTH_CACHE_SECONDS = float(os.environ.get("GATEWAY_AUTH_CACHE_SECONDS", "2"))
# While no web process answers, the gateway lets through by itself the keys a web process let
# through within this many seconds (marketplace/clusters/remembered.py).
GATEWAY_REMEMBER_SECONDS = int(os.environ.get("GATEWAY_REMEMBER_SECONDS", "900"))
# Autoscaling: grow on the mean rate of the last UP seconds, shrink on the busiest of the
# last DOWN seconds.
CLUSTER_SCALE_UP_WINDOW = int(os.environ.get("CLUSTER_SCALE_UP_WINDOW", "10"))
CLUSTER_SCALE_DOWN_WINDOW = int(os.environ.get("CLUSTER_SCALE_DOWN_WINDOW", "60"))

# Labels added to every container the platform starts (tests tag theirs for clean-up).
CONTAINER_EXTRA_LABELS = dict(
    item.split("=", 1) for item in env_list("CONTAINER_EXTRA_LABELS") if "=" in item
)
# Rents a web process receives together are placed in one transaction (group commit,
# core/group_commit.py); RENT_GROUP_COMMIT=0 places each rent alone.
RENT_GROUP_COMMIT = env_bool("RENT_GROUP_COMMIT", True)
# Under load a batch's leader waits up to this many milliseconds
# for the callers the last batch answered to come back with their next orders; 0: never waits
# (batches then hold only what queued while the last one ran).
RENT_GATHER_MS = float(os.environ.get("RENT_GATHER_MS", "10"))
# An expired rental's data is kept this long (free of charge), then deleted.
DATA_GRACE_HOURS = int(os.environ.get("DATA_GRACE_HOURS", "48"))
# A deployment's replica whose machine stopped answering (its containers may well be serving)
# is replaced only after this long; back within it, the replica is adopted again.
REPLICA_UNREACHABLE_GRACE_MINUTES = float(os.environ.get("REPLICA_UNREACHABLE_GRACE_MINUTES", "10"))

# --- REST API -----------------------------------------------------------------------------
# Offer search answered by each web process's in-memory index of offers
# (marketplace/offer_index.py; PostgreSQL only). Off: every search runs as SQL.
OFFER_INDEX = env_bool("OFFER_INDEX", True)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "marketplace.api.auth.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["marketplace.api.permissions.TeamAccess"],
    "DEFAULT_PAGINATION_CLASS": "marketplace.api.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    # JSON bounded in size and depth (413/400, not a RecursionError's 500); forms as DRF has them.
    "DEFAULT_PARSER_CLASSES": [
        "marketplace.api.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "marketplace.api.errors.api_exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # Per API key or user (marketplace/api/throttling.py); over a budget the API answers 429.
    "DEFAULT_THROTTLE_CLASSES": [
        "marketplace.api.throttling.WriteRateThrottle",
        "marketplace.api.throttling.OfferSearchRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "write": os.environ.get("API_THROTTLE_WRITE", "600/min"),
        "offer_search": os.environ.get("API_THROTTLE_OFFER_SEARCH", "1200/min"),
    },
}
SPECTACULAR_SETTINGS = {
    "TITLE": "GPU Marketplace API",
    "DESCRIPTION": (
        "Rent GPU units on provider machines and run containers. Authenticate with "
        "`Authorization: Bearer <api key>`; every error has the shape "
        '`{"error": {"code", "message", "fields"}}`.'
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Serve Swagger UI's files ourselves: the docs page works with no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Payments -----------------------------------------------------------------------------
STRIPE_SECRET_KEY = os.environ.get("STRIPE_SECRET_KEY", "")
STRIPE_WEBHOOK_SECRET = os.environ.get("STRIPE_WEBHOOK_SECRET", "")
STRIPE_API_BASE = os.environ.get("STRIPE_API_BASE", "")  # tests point the SDK at a local endpoint
# The test-credit button exists only in DEBUG without Stripe keys.
TEST_CREDIT_ENABLED = DEBUG and not STRIPE_SECRET_KEY

# --- Hosts --------------------------------------------------------------------------------
PLATFORM_SSH_KEY_PATH = Path(os.environ.get("PLATFORM_SSH_KEY_PATH", VAR_DIR / "platform_ssh_key"))

# --- Security -----------------------------------------------------------------------------
# HTTPS protections follow DEBUG unless set explicitly (tests set HTTPS_ONLY=0 to use the
# plain-HTTP test client with DEBUG off).
HTTPS_ONLY = env_bool("HTTPS_ONLY", not DEBUG)
SESSION_COOKIE_SECURE = HTTPS_ONLY
CSRF_COOKIE_SECURE = HTTPS_ONLY
SECURE_SSL_REDIRECT = HTTPS_ONLY
SECURE_HSTS_SECONDS = 31536000 if HTTPS_ONLY else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS_ONLY
SECURE_HSTS_PRELOAD = HTTPS_ONLY
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("BEHIND_PROXY", False) else None
)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"

# --- Logs, health and metrics (marketplace/observability/) ----------------------------------
# Structured logs through structlog: one JSON object a line (``json``) or aligned key=value
# text for people (``console``, the default with DEBUG). See marketplace/observability/logs.py.
LOG_FORMAT = os.environ.get("LOG_FORMAT", "console" if DEBUG else "json")
if LOG_FORMAT not in {"json", "console"}:
    raise ImproperlyConfigured("LOG_FORMAT must be json or console.")
LOGGING_CONFIG = "marketplace.observability.logs.configure_logging"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "marketplace.observability.logs.json_formatter"},
        "console": {"()": "marketplace.observability.logs.console_formatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    # WeasyPrint logs each layout step of every PDF invoice at INFO.
    "loggers": {"paramiko": {"level": "WARNING"}, "weasyprint": {"level": "WARNING"}},
}
# Tasks queued during a request carry its request id to the worker (the worker side is the
# boot step in marketplace/celery.py).
DJANGO_STRUCTLOG_CELERY_ENABLED = True
# "request_started" only when debugging: "request_finished" says the same and more.
DJANGO_STRUCTLOG_STATUS_START_LOG_LEVEL = logging.DEBUG
# An id the proxy in front already gave the request (X-Request-ID) is kept only behind our
# own proxy; otherwise a client could choose the id of its lines.
DJANGO_STRUCTLOG_TRUST_UPSTREAM_REQUEST_ID = env_bool("BEHIND_PROXY", False)
# A line's ``ip`` is the peer uvicorn gives (``LogContextMiddleware``): django-structlog's
# own lookup believes any client's X-Forwarded-For.
DJANGO_STRUCTLOG_IP_LOGGING_ENABLED = False

# /metrics answers a scraper that sends ``Authorization: Bearer <METRICS_TOKEN>``, or a staff
# user's session; anyone else gets 404. Empty: staff sessions only.
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")
# The ledger check behind the ``gpumkt_ledger_consistent`` gauge runs at most this often.
METRICS_LEDGER_CHECK_SECONDS = int(os.environ.get("METRICS_LEDGER_CHECK_SECONDS", "60"))
# Workers serve their task metrics on this port (one exporter per worker node; see
# marketplace/observability/task_metrics.py). Empty: no exporter.
WORKER_METRICS_PORT = os.environ.get("WORKER_METRICS_PORT", "")
# Probes and scrapers talk plain HTTP to each process directly (the service manager, the
# Prometheus server on the private network), so these paths are not redirected to HTTPS.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
# Readiness checks give each dependency this long to answer.
READINESS_TIMEOUT_SECONDS = float(os.environ.get("READINESS_TIMEOUT_SECONDS", "1"))

# --- Billing settings ---
# Share of every usage charge that goes to the platform (percent; decimals allowed, e.g. 12.5).
PLATFORM_FEE_PERCENT = os.environ.get("PLATFORM_FEE_PERCENT", "10")
BILLING_CURRENCY = "usd"
BILLING_TOPUP_PRODUCT_NAME = "GPU Marketplace credit"
# Top-up limits in micro-dollars ($5 to $10,000 by default).
BILLING_TOPUP_MIN = int(os.environ.get("BILLING_TOPUP_MIN_USD", "5")) * 1_000_000
BILLING_TOPUP_MAX = int(os.environ.get("BILLING_TOPUP_MAX_USD", "10000")) * 1_000_000
# The least a provider may ask to be paid out at once, in micro-dollars ($10 by default).
BILLING_PAYOUT_MIN = int(os.environ.get("BILLING_PAYOUT_MIN_USD", "10")) * 1_000_000
# With Stripe keys: the operator may pay payout requests through Stripe Connect, to the
# provider's connected account (billing.PayoutDestination). Off: paid outside, then recorded.
STRIPE_CONNECT_PAYOUTS = env_bool("STRIPE_CONNECT_PAYOUTS", False)
# The DEBUG test-credit button grants this much (micro-dollars) per click.
BILLING_TEST_CREDIT_AMOUNT = 100 * 1_000_000
# Connections the metering sweep settles its batches on (PostgreSQL; each a thread with its
# own connection from the worker's pool, closed when the sweep ends). See
# marketplace/rentals/metering.py for the measurements behind the default.
METERING_SWEEP_CONNECTIONS = int(os.environ.get("METERING_SWEEP_CONNECTIONS", "2"))
# Oldest Stripe-Signature timestamp the webhook accepts, in seconds (Stripe's default).
STRIPE_WEBHOOK_TOLERANCE = int(os.environ.get("STRIPE_WEBHOOK_TOLERANCE", "300"))

# --- Scheduler settings ---
# The lease on an instance's launch, stop or destroy (scheduler/work.py): a worker that dies
# mid-way has its work taken over by another about this long (plus a sweep period) later.
WORK_LEASE_SECONDS = int(os.environ.get("WORK_LEASE_SECONDS", "30"))

# --- Hosts settings ---
HOST_HEARTBEAT_SECONDS = int(os.environ.get("HOST_HEARTBEAT_SECONDS", "30"))
HOST_HEARTBEAT_MISSES = int(os.environ.get("HOST_HEARTBEAT_MISSES", "3"))
# Failed probes in a row before a machine leaves service, and how soon one that answers
# heartbeats is probed again (hosts/services/probing.py).
HOST_PROBE_FAILURES = int(os.environ.get("HOST_PROBE_FAILURES", "3"))
HOST_PROBE_RETRY_SECONDS = int(os.environ.get("HOST_PROBE_RETRY_SECONDS", "300"))
# Machines on loopback addresses: only for development and the simulated hosts (which are
# sshd on 127.x); in production that is the platform's own machine (hosts/addresses.py).
HOST_ALLOW_LOOPBACK = env_bool("HOST_ALLOW_LOOPBACK", DEBUG)
# Image of the self-test container: small, with sh, sleep, cat, df and env. Simulated
# hosts have gpumkt/busybox (made without a registry); real machines pull busybox.
HOST_SELFTEST_IMAGE = os.environ.get(
    "HOST_SELFTEST_IMAGE", "gpumkt/busybox:latest" if DEBUG else "busybox:1.36"
)
# Verification (hosts/verification): how often a verified machine is measured again, how soon
# a failed one is retried, and what it must keep: reliability, and GPU figures at least this
# share of its model's typical ones (hosts/benchmark/typical.py).
HOST_VERIFY_EVERY_HOURS = float(os.environ.get("HOST_VERIFY_EVERY_HOURS", "24"))
HOST_VERIFY_RETRY_MINUTES = float(os.environ.get("HOST_VERIFY_RETRY_MINUTES", "30"))
HOST_VERIFY_MIN_RELIABILITY = float(os.environ.get("HOST_VERIFY_MIN_RELIABILITY", "0.9"))
HOST_VERIFY_MIN_SHARE_OF_TYPICAL = float(os.environ.get("HOST_VERIFY_MIN_SHARE_OF_TYPICAL", "0.7"))
# The window reliability is computed over (hosts/services/heartbeats.py), in days.
HOST_RELIABILITY_WINDOW_DAYS = float(os.environ.get("HOST_RELIABILITY_WINDOW_DAYS", "7"))
# The benchmark (hosts/benchmark): the GPU benchmark image (its contract is in
# hosts/benchmark/gpu.py; simulated hosts have a stand-in made without a registry), the file
# written and read inside a rental-sized container, and the payload sent each way over SSH.
HOST_GPU_BENCH_IMAGE = os.environ.get(
    "HOST_GPU_BENCH_IMAGE", "gpumkt/gpu-bench-sim:latest" if DEBUG else "gpumkt/gpu-bench:1"
)
HOST_GPU_BENCH_TIMEOUT = float(os.environ.get("HOST_GPU_BENCH_TIMEOUT", "300"))
HOST_BENCH_DISK_MB = int(os.environ.get("HOST_BENCH_DISK_MB", "64"))
HOST_BENCH_TRANSFER_MB = int(os.environ.get("HOST_BENCH_TRANSFER_MB", "8"))
