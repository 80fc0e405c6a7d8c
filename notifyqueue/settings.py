"""Django settings for Notify Queue. Every knob is an environment variable (contract section 2).

Production needs DATABASE_URL and DJANGO_SECRET_KEY; without them the process stops with a
message saying so. Only the development switch NOTIFYQUEUE_DEV_EMBEDDED_DB=1, which
`python3 dev.py` and the tests set, allows neither: it starts the embedded PostgreSQL under
`.notifyqueue/` when DATABASE_URL is unset, uses a development secret key and relaxes the
HTTPS-only settings (cookies, redirect, HSTS) for plain http://127.0.0.1.
"""

import sys
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from notifyqueue import embedded_db

BASE_DIR = Path(__file__).resolve().parent.parent
STATE_DIR = BASE_DIR / ".notifyqueue"

env = environ.Env()

DEV_EMBEDDED_DB = env.bool("NOTIFYQUEUE_DEV_EMBEDDED_DB", default=False)
DATABASE_URL = env.str("DATABASE_URL", default="")
if not DATABASE_URL:
    if not DEV_EMBEDDED_DB:
        raise ImproperlyConfigured(
            "DATABASE_URL is not set. Set it to your PostgreSQL, e.g. "
            "DATABASE_URL=postgresql://notifyqueue:secret@db.internal:5432/notifyqueue. "
            "For development, `python3 dev.py serve` and `python3 dev.py test` start an embedded "
            "PostgreSQL and set it for you (NOTIFYQUEUE_DEV_EMBEDDED_DB=1 lets any process "
            "start that one)."
        )
    DATABASE_URL = embedded_db.database_url(STATE_DIR)
DEBUG = env.bool("DJANGO_DEBUG", default=False)
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="")
if not SECRET_KEY:
    if not (DEV_EMBEDDED_DB or DEBUG):
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY is not set. Set it to a long random string (e.g. the output of "
            "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`). Only development "
            "(`python3 dev.py ...`, or NOTIFYQUEUE_DEV_EMBEDDED_DB=1) runs without one."
        )
    SECRET_KEY = "dev-only-insecure-key-change-me"
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])

# HTTPS-only by default; development serves plain http on loopback. /status and /metrics are
# exempt from the redirect so health checks and scrapers inside the network can use http.
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=not DEV_EMBEDDED_DB)
SECURE_REDIRECT_EXEMPT = [r"^status$", r"^metrics$"]
SESSION_COOKIE_SECURE = env.bool("DJANGO_SESSION_COOKIE_SECURE", default=not DEV_EMBEDDED_DB)
CSRF_COOKIE_SECURE = env.bool("DJANGO_CSRF_COOKIE_SECURE", default=not DEV_EMBEDDED_DB)
SECURE_HSTS_SECONDS = env.int(
    "DJANGO_SECURE_HSTS_SECONDS", default=0 if DEV_EMBEDDED_DB else 365 * 24 * 3600
)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_SECURE_HSTS_PRELOAD", default=True)
# Behind a proxy that terminates TLS and sets X-Forwarded-Proto (set it only then).
if env.bool("DJANGO_TRUST_X_FORWARDED_PROTO", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework_api_key",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_prometheus",
    "clients",
    "notifications",
    "delivery",
    "delivery.circuits",
    "delivery.receipts",
    "webhooks",
    "ratelimits",
    "templates",
    "monitoring",
    "health",
    "preferences",
    "suppressions",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files (the admin's CSS, Swagger UI, ReDoc) from STATIC_ROOT, under gunicorn too.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # /api/ only: NUL in path, query or headers -> 400; Content-Length over the cap -> 413.
    "notifyqueue.middleware.ApiRequestGuardMiddleware",
    # Django's own, skipped under /api/v1/ (API keys there, no sessions or messages).
    "notifyqueue.middleware.BrowserOnlySessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "notifyqueue.middleware.BrowserOnlyAuthenticationMiddleware",
    "notifyqueue.middleware.BrowserOnlyMessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # django-prometheus' per-view metrics, each labelled series looked up once per process.
    "monitoring.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "notifyqueue.urls"
# The create endpoints answered before Django's handler (notifyqueue/serving/shortcuts.py).
API_SHORTCUTS = "notifications.views.api_shortcuts"
WSGI_APPLICATION = "notifyqueue.wsgi.application"
ASGI_APPLICATION = "notifyqueue.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # Project HTML lives here; the `templates` app holds message templates, not Django ones.
        "DIRS": [BASE_DIR / "notifyqueue" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.db_url_config(DATABASE_URL)}
# A Unix-socket URL (`?host=/path`, as the embedded server's) lands in OPTIONS; name it as HOST
# so tools and tests that build URLs from the settings find it.
if "host" in DATABASES["default"].get("OPTIONS", {}):
    DATABASES["default"]["HOST"] = DATABASES["default"]["OPTIONS"].pop("host")
# django-prometheus' wrapper of Django's PostgreSQL backend (psycopg 3): query, error and
# connection counters by alias on /metrics. Same SQL, same connections.
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"]["ENGINE"] = "django_prometheus.db.backends.postgresql"
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", default=60))
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Every process must also run through PgBouncer in transaction mode (docs/operations.md), where
# nothing outlives its transaction: no WITH HOLD cursor, which QuerySet.iterator() opens outside
# a transaction (the admin's select lists do). No result here is big enough to need streaming.
# (Django's defaults already keep the rest out: client-side binding, no prepared statements.)
DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# `notifyqueue collectstatic` copies the admin's and the API docs' files here, and WhiteNoise
# serves them from here, whichever folder a command starts in: DJANGO_STATIC_ROOT, else
# var/notifyqueue/static in the Python environment the project is installed in (the
# virtualenv), so gunicorn and every `notifyqueue` command of one installation agree.
STATIC_ROOT = env.path(
    "DJANGO_STATIC_ROOT", default=Path(sys.prefix) / "var" / "notifyqueue" / "static"
)
# Development serves the apps' static folders directly (no collectstatic step).
WHITENOISE_USE_FINDERS = DEV_EMBEDDED_DB
WHITENOISE_AUTOREFRESH = DEV_EMBEDDED_DB

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["clients.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON with the body's bounds: size (413), nesting depth and NUL characters (400).
    "DEFAULT_PARSER_CLASSES": ["notifyqueue.parsers.BoundedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "notifyqueue.errors.api_exception_handler",
    # Per client, counted in PostgreSQL (NOTIFYQUEUE_API_RATE_LIMIT below).
    "DEFAULT_THROTTLE_CLASSES": ["clients.throttling.ClientRequestThrottle"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Notify Queue API",
    "DESCRIPTION": (
        "Schedule email, SMS, push and in-app notifications; each is delivered exactly once, "
        "in priority order, within the recipient's rate limit, and reported by a signed webhook."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Channels appear in notifications, templates and preferences: one enum for all of them.
    "ENUM_NAME_OVERRIDES": {"ChannelEnum": "notifications.models.Channel.values"},
    # The ApiKey security scheme comes from clients/schema.py.
    # 400/401/404/413/429 that every operation can answer (notifyqueue/openapi.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "notifyqueue.openapi.postprocess_common_responses",
    ],
    # Swagger UI and ReDoc from drf-spectacular-sidecar's static files: no CDN, work offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

EMAIL_CONFIG = env.email_url("EMAIL_URL", default="consolemail://")
vars().update(EMAIL_CONFIG)
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="notifications@notifyqueue.local")

# --- The queue (contract section 2) ---
NOTIFYQUEUE_MAX_ATTEMPTS = env.int("NOTIFYQUEUE_MAX_ATTEMPTS", default=6)
NOTIFYQUEUE_BACKOFF_BASE_SECONDS = env.float("NOTIFYQUEUE_BACKOFF_BASE_SECONDS", default=0.5)
NOTIFYQUEUE_BACKOFF_MAX_SECONDS = env.float("NOTIFYQUEUE_BACKOFF_MAX_SECONDS", default=60.0)
NOTIFYQUEUE_CLAIM_TIMEOUT_SECONDS = env.float("NOTIFYQUEUE_CLAIM_TIMEOUT_SECONDS", default=300.0)
# Per (client, recipient), the recipient normalised for counting (notifyqueue/addresses.py).
NOTIFYQUEUE_RATE_LIMIT = env.int("NOTIFYQUEUE_RATE_LIMIT", default=10)
# Per normalised address across all clients, in the same window; 0 is off.
NOTIFYQUEUE_RECIPIENT_RATE_LIMIT = env.int("NOTIFYQUEUE_RECIPIENT_RATE_LIMIT", default=0)
NOTIFYQUEUE_RATE_LIMIT_WINDOW_SECONDS = env.float(
    "NOTIFYQUEUE_RATE_LIMIT_WINDOW_SECONDS", default=3600.0
)
NOTIFYQUEUE_WEBHOOK_MAX_ATTEMPTS = env.int("NOTIFYQUEUE_WEBHOOK_MAX_ATTEMPTS", default=10)
# Seconds before attempt 1, 2, ... (Standard Webhooks' schedule); past its end the last step
# repeats. docs/webhooks.md.
NOTIFYQUEUE_WEBHOOK_RETRY_SCHEDULE = env.list(
    "NOTIFYQUEUE_WEBHOOK_RETRY_SCHEDULE",
    cast=float,
    default=[0, 5, 300, 1800, 7200, 18000, 36000, 36000],
)
# Webhook POSTs in flight at once for one client, over all senders (fairness between clients).
NOTIFYQUEUE_WEBHOOK_CLIENT_CONCURRENCY = env.int(
    "NOTIFYQUEUE_WEBHOOK_CLIENT_CONCURRENCY", default=4
)
NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE = env.bool("NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE", default=False)
# One webhook POST, connect to last byte, never takes longer than this.
NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS = env.float("NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS", default=5.0)
# Events claimed per sender step at most, and POSTs in flight at once in one sender: four
# clients' worth at the default CLIENT_CONCURRENCY, so it takes four hanging endpoints to hold
# every slot (docs/webhooks.md, "How fast").
NOTIFYQUEUE_WEBHOOK_BATCH_SIZE = env.int("NOTIFYQUEUE_WEBHOOK_BATCH_SIZE", default=16)
NOTIFYQUEUE_WEBHOOK_CONCURRENCY = env.int("NOTIFYQUEUE_WEBHOOK_CONCURRENCY", default=16)
# A webhook claim older than this is given back (its sender died). It must exceed one POST's
# deadline (TIMEOUT) by a margin.
NOTIFYQUEUE_WEBHOOK_CLAIM_TIMEOUT_SECONDS = env.float(
    "NOTIFYQUEUE_WEBHOOK_CLAIM_TIMEOUT_SECONDS", default=60.0
)
NOTIFYQUEUE_PROVIDERS = {
    channel: {
        "provider": env.str(f"NOTIFYQUEUE_{channel.upper()}_PROVIDER", default="simulated"),
        "url": env.str(f"NOTIFYQUEUE_{channel.upper()}_PROVIDER_URL", default=""),
        # The secret that signs the provider's delivery receipts (Standard Webhooks,
        # `whsec_<base64>`); several, space-separated, while one is rotated. Unset: the
        # channel's receipts endpoint answers 404.
        "events_secrets": env.str(
            f"NOTIFYQUEUE_{channel.upper()}_PROVIDER_EVENTS_SECRET", default=""
        ).split(),
    }
    for channel in ("email", "sms", "push")
}
# The API's public base URL (https://notify.example.com). Set, every non-CRITICAL email
# carries a one-click List-Unsubscribe URL under it (RFC 8058); unset, emails carry no such
# header and `manage.py check --deploy` and run_worker warn.
NOTIFYQUEUE_PUBLIC_URL = env.str("NOTIFYQUEUE_PUBLIC_URL", default="").rstrip("/")
# The key that signs unsubscribe tokens (required with NOTIFYQUEUE_PUBLIC_URL), and the
# earlier keys still accepted while one is rotated (comma-separated).
NOTIFYQUEUE_UNSUBSCRIBE_SECRET = env.str("NOTIFYQUEUE_UNSUBSCRIBE_SECRET", default="")
NOTIFYQUEUE_UNSUBSCRIBE_SECRET_FALLBACKS = env.list(
    "NOTIFYQUEUE_UNSUBSCRIBE_SECRET_FALLBACKS", default=[]
)
# How long an unsubscribe link works after its email was sent (at least 60 days).
NOTIFYQUEUE_UNSUBSCRIBE_TOKEN_DAYS = env.int("NOTIFYQUEUE_UNSUBSCRIBE_TOKEN_DAYS", default=90)
# A receipt's signature timestamp may be this far from the API's clock (either way).
NOTIFYQUEUE_RECEIPT_TOLERANCE_SECONDS = env.float(
    "NOTIFYQUEUE_RECEIPT_TOLERANCE_SECONDS", default=300.0
)
# A receipt that names no sent message is kept this long for its attempt's result, then
# dropped.
NOTIFYQUEUE_RECEIPT_PENDING_SECONDS = env.float(
    "NOTIFYQUEUE_RECEIPT_PENDING_SECONDS", default=86400.0
)
NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS = env.float(
    "NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS", default=10.0
)
NOTIFYQUEUE_SIMULATED_FAILURE_RATE = env.float("NOTIFYQUEUE_SIMULATED_FAILURE_RATE", default=0.0)
NOTIFYQUEUE_CIRCUIT_FAILURE_THRESHOLD = env.int("NOTIFYQUEUE_CIRCUIT_FAILURE_THRESHOLD", default=5)
NOTIFYQUEUE_CIRCUIT_COOLDOWN_SECONDS = env.float(
    "NOTIFYQUEUE_CIRCUIT_COOLDOWN_SECONDS", default=30.0
)
# The longest a notification waits, held, while its provider's circuit stays open; then it is
# DEAD_LETTERED (last_error "circuit_open: ...").
NOTIFYQUEUE_CIRCUIT_MAX_HOLD_SECONDS = env.float(
    "NOTIFYQUEUE_CIRCUIT_MAX_HOLD_SECONDS", default=86_400.0
)
# A NORMAL or LOW notification moves up one priority level (never above HIGH) for each such
# period it has waited past its due time; 0 turns aging off (delivery/checks.py rejects a
# negative or non-finite value).
NOTIFYQUEUE_PRIORITY_AGING_SECONDS = env.float("NOTIFYQUEUE_PRIORITY_AGING_SECONDS", default=300.0)
NOTIFYQUEUE_CLIENT_MAX_PENDING = env.int("NOTIFYQUEUE_CLIENT_MAX_PENDING", default=100_000)
# API requests per client per fixed window (429 with Retry-After past it); 0 turns it off.
NOTIFYQUEUE_API_RATE_LIMIT = env.int("NOTIFYQUEUE_API_RATE_LIMIT", default=60_000)
NOTIFYQUEUE_API_RATE_LIMIT_WINDOW_SECONDS = env.float(
    "NOTIFYQUEUE_API_RATE_LIMIT_WINDOW_SECONDS", default=60.0
)
# How often an idle worker looks for due work even without a LISTEN/NOTIFY wake-up.
NOTIFYQUEUE_POLL_INTERVAL_SECONDS = env.float("NOTIFYQUEUE_POLL_INTERVAL_SECONDS", default=1.0)
# A worker writes its heartbeat row this often, from a thread of its own.
NOTIFYQUEUE_HEARTBEAT_SECONDS = env.float("NOTIFYQUEUE_HEARTBEAT_SECONDS", default=5.0)
# A worker whose heartbeat is older than this (database clock) is dead: another worker takes
# its notification and webhook claims over at once, without waiting for their claim timeout.
# At least three heartbeats (delivery/checks.py), so two missed beats never kill a live one.
NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS = env.float(
    "NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS", default=30.0
)
# Where a worker LISTENs for wake-ups (a session of its own). Empty: DATABASE_URL. Set it to
# the server itself when DATABASE_URL goes through PgBouncer in transaction mode.
NOTIFYQUEUE_LISTEN_DATABASE_URL = env.str("NOTIFYQUEUE_LISTEN_DATABASE_URL", default="")
# /status is degraded when no worker is alive and PENDING work has been due for longer than
# this (default: two poll intervals).
NOTIFYQUEUE_STATUS_MAX_OVERDUE_SECONDS = env.float(
    "NOTIFYQUEUE_STATUS_MAX_OVERDUE_SECONDS", default=2 * NOTIFYQUEUE_POLL_INTERVAL_SECONDS
)
# /metrics is open to anyone unless NOTIFYQUEUE_METRICS_PUBLIC=false; then it needs
# `Authorization: Bearer <NOTIFYQUEUE_METRICS_TOKEN>` (and with no token, nobody gets in).
NOTIFYQUEUE_METRICS_PUBLIC = env.bool("NOTIFYQUEUE_METRICS_PUBLIC", default=True)
NOTIFYQUEUE_METRICS_TOKEN = env.str("NOTIFYQUEUE_METRICS_TOKEN", default="")

# LOG_FORMAT=json: one JSON object per line, with each `key=value` of the message as a field.
LOG_FORMAT = env.str("LOG_FORMAT", default="plain")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "notifyqueue.logformat.JsonFormatter"},
    },
    "filters": {"quoted_values_removed": {"()": "notifyqueue.logformat.QuotedValuesRemoved"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "plain",
            # A database error's text can quote message content (notifyqueue/logformat.py).
            "filters": ["quoted_values_removed"],
        }
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "pgserver": {"level": "WARNING"},
    },
}
