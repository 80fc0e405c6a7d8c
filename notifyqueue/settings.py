"""Django settings for Notify Queue. Every knob is an environment variable (contract section 2)."""

from pathlib import Path

import environ

from notifyqueue.embedded_db import database_url

BASE_DIR = Path(__file__).resolve().parent.parent
STATE_DIR = BASE_DIR / ".notifyqueue"

env = environ.Env()

SECRET_KEY = env("DJANGO_SECRET_KEY", default="dev-only-insecure-key-change-me")
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])

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
    "django_prometheus",
    "clients",
    "notifications",
    "delivery",
    "delivery.circuits",
    "webhooks",
    "ratelimits",
    "templates",
    "monitoring",
    "preferences",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # /api/ only: NUL in path, query or headers -> 400; Content-Length over the cap -> 413.
    "notifyqueue.middleware.ApiRequestGuardMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "notifyqueue.urls"
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

if env.str("DATABASE_URL", default=""):
    DATABASES = {"default": env.db("DATABASE_URL")}
else:
    DATABASES = {"default": env.db_url_config(database_url(STATE_DIR))}
    # The embedded server listens on a Unix socket; name it as HOST so psql and tools find it.
    DATABASES["default"]["HOST"] = DATABASES["default"]["OPTIONS"].pop("host")
# django-prometheus' wrapper of Django's PostgreSQL backend (psycopg 3): query, error and
# connection counters by alias on /metrics. Same SQL, same connections.
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"]["ENGINE"] = "django_prometheus.db.backends.postgresql"
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", default=60))
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = STATE_DIR / "static"

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
}

EMAIL_CONFIG = env.email_url("EMAIL_URL", default="consolemail://")
vars().update(EMAIL_CONFIG)
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="notifications@notifyqueue.local")

# --- The queue (contract section 2) ---
NOTIFYQUEUE_MAX_ATTEMPTS = env.int("NOTIFYQUEUE_MAX_ATTEMPTS", default=6)
NOTIFYQUEUE_BACKOFF_BASE_SECONDS = env.float("NOTIFYQUEUE_BACKOFF_BASE_SECONDS", default=0.5)
NOTIFYQUEUE_BACKOFF_MAX_SECONDS = env.float("NOTIFYQUEUE_BACKOFF_MAX_SECONDS", default=60.0)
NOTIFYQUEUE_CLAIM_TIMEOUT_SECONDS = env.float("NOTIFYQUEUE_CLAIM_TIMEOUT_SECONDS", default=300.0)
NOTIFYQUEUE_RATE_LIMIT = env.int("NOTIFYQUEUE_RATE_LIMIT", default=10)
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
# Events claimed per sender step at most, and POSTs in flight at once in one sender.
NOTIFYQUEUE_WEBHOOK_BATCH_SIZE = env.int("NOTIFYQUEUE_WEBHOOK_BATCH_SIZE", default=16)
NOTIFYQUEUE_WEBHOOK_CONCURRENCY = env.int("NOTIFYQUEUE_WEBHOOK_CONCURRENCY", default=8)
# A webhook claim older than this is given back (its sender died). It must exceed one POST's
# deadline (TIMEOUT) by a margin.
NOTIFYQUEUE_WEBHOOK_CLAIM_TIMEOUT_SECONDS = env.float(
    "NOTIFYQUEUE_WEBHOOK_CLAIM_TIMEOUT_SECONDS", default=60.0
)
NOTIFYQUEUE_PROVIDERS = {
    channel: {
        "provider": env.str(f"NOTIFYQUEUE_{channel.upper()}_PROVIDER", default="simulated"),
        "url": env.str(f"NOTIFYQUEUE_{channel.upper()}_PROVIDER_URL", default=""),
    }
    for channel in ("email", "sms", "push")
}
NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS = env.float(
    "NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS", default=10.0
)
NOTIFYQUEUE_SIMULATED_FAILURE_RATE = env.float("NOTIFYQUEUE_SIMULATED_FAILURE_RATE", default=0.0)
NOTIFYQUEUE_CIRCUIT_FAILURE_THRESHOLD = env.int("NOTIFYQUEUE_CIRCUIT_FAILURE_THRESHOLD", default=5)
NOTIFYQUEUE_CIRCUIT_COOLDOWN_SECONDS = env.float(
    "NOTIFYQUEUE_CIRCUIT_COOLDOWN_SECONDS", default=30.0
)
NOTIFYQUEUE_CLIENT_MAX_PENDING = env.int("NOTIFYQUEUE_CLIENT_MAX_PENDING", default=100_000)
# API requests per client per fixed window (429 with Retry-After past it); 0 turns it off.
NOTIFYQUEUE_API_RATE_LIMIT = env.int("NOTIFYQUEUE_API_RATE_LIMIT", default=60_000)
NOTIFYQUEUE_API_RATE_LIMIT_WINDOW_SECONDS = env.float(
    "NOTIFYQUEUE_API_RATE_LIMIT_WINDOW_SECONDS", default=60.0
)
# How often an idle worker looks for due work even without a LISTEN/NOTIFY wake-up.
NOTIFYQUEUE_POLL_INTERVAL_SECONDS = env.float("NOTIFYQUEUE_POLL_INTERVAL_SECONDS", default=1.0)
NOTIFYQUEUE_HEARTBEAT_SECONDS = env.float("NOTIFYQUEUE_HEARTBEAT_SECONDS", default=5.0)
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
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "plain",
        }
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "pgserver": {"level": "WARNING"},
    },
}
