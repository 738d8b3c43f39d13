"""Settings of the demo project.

With no environment variables it runs on an embedded default that needs no server: SQLite in
WAL mode and kombu's filesystem broker under ``var/``. Set ``DATABASE_URL`` (PostgreSQL) and
``CELERY_BROKER_URL`` (Redis or RabbitMQ) to run the same code on real servers.
"""

import os
from importlib.util import find_spec
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("QUEUETY_VAR_DIR", BASE_DIR / "var"))

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-insecure-key-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1").split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_celery_beat",
    "queuety",
    "project",
]
# On Django 5.2 the tasks framework is the django-tasks backport, an app of its own.
if find_spec("django.tasks") is None and find_spec("django_tasks") is not None:
    INSTALLED_APPS.insert(INSTALLED_APPS.index("queuety"), "django_tasks")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The demo site's own templates (templates/: its admin branding, and its override of
        # Queuety's approval page); Queuety's are in the app (APP_DIRS), so its wheel has them.
        "DIRS": [BASE_DIR / "templates"],
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

WSGI_APPLICATION = "project.wsgi.application"

EMBEDDED = "DATABASE_URL" not in os.environ
if EMBEDDED:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "queuety.sqlite3",
            "OPTIONS": {
                # Writers queue for the lock instead of failing with "database is locked".
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
    # queuety.W001 says SQLite is for a demo on one machine: this is that demo.
    SILENCED_SYSTEM_CHECKS = ["queuety.W001"]
else:
    DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"], conn_max_age=600)}
    # Prepared statements stay off (Django's default), which is safe behind any pooler.
    # QUEUETY_PREPARED_STATEMENTS=1 allows them when the workers connect to PostgreSQL
    # directly, or through PgBouncer 1.21+ with max_prepared_statements: Queuety then
    # prepares the statements every step runs. Never behind PgBouncer in transaction mode
    # before 1.21 (docs/deploy/running-workers.md, "Behind PgBouncer").
    if os.environ.get("QUEUETY_PREPARED_STATEMENTS", "0") == "1":
        DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 5
    # QUEUETY_DB_POOL=20: Django's connection pool, at most that many connections per worker
    # process (what an I/O lane worker, --pool threads, should run with: its threads share
    # them; docs/deploy/io-lane.md). Pooled connections are not also kept by CONN_MAX_AGE.
    if os.environ.get("QUEUETY_DB_POOL"):
        DATABASES["default"]["CONN_MAX_AGE"] = 0
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1, "max_size": int(os.environ["QUEUETY_DB_POOL"]), "timeout": 60}
    if os.environ.get("QUEUETY_DB_APPLICATION_NAME"):
        DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = \
            os.environ["QUEUETY_DB_APPLICATION_NAME"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
USE_I18N = True
STATIC_URL = "static/"

# --- Celery ------------------------------------------------------------------------------
if "CELERY_BROKER_URL" in os.environ:
    CELERY_BROKER_URL = os.environ["CELERY_BROKER_URL"]
else:
    BROKER_DIR = VAR_DIR / "broker"
    for folder in ("queue", "processed"):
        (BROKER_DIR / folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "store_processed": False,
        # The filesystem transport polls its folder; 0.1 s keeps step hand-offs snappy.
        "polling_interval": 0.1,
    }
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "celery")
CELERY_TASK_IGNORE_RESULT = True
# A message is acknowledged only after its step ran, and given back if the process died.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
# Keep database connections across tasks: without this, Celery's Django fixup closes them
# before and after EVERY task, so each step paid for a new PostgreSQL session. Broken or
# expired connections are still closed, by queuety.tasks (Django's close_old_connections).
CELERY_DB_REUSE_MAX = 10_000
# Containment of a bad step (see docs/deploy/running-workers.md): a pool process is replaced after
# this many tasks, or after a task leaves it above this resident memory (KiB), so a leak costs
# one process, not the worker. Steps that may hang get a `timeout` (the demo's ChargeCard has
# one): their message carries a hard time limit. A site-wide limit is opt-in
# (QUEUETY_TASK_TIME_LIMIT seconds): Celery keeps a cancelled timer per task until the limit
# would have fired, which measured +37 MiB of worker RSS per 100,000 steps with 3600 s.
CELERY_WORKER_MAX_TASKS_PER_CHILD = int(os.environ.get("QUEUETY_MAX_TASKS_PER_CHILD", 10_000))
CELERY_WORKER_MAX_MEMORY_PER_CHILD = int(os.environ.get("QUEUETY_MAX_MEMORY_PER_CHILD_KIB",
                                                        512 * 1024))
CELERY_TASK_TIME_LIMIT = int(os.environ.get("QUEUETY_TASK_TIME_LIMIT", 0)) or None
CELERY_TIMEZONE = TIME_ZONE

QUEUETY = {}

# Django's tasks framework (django.tasks; the django-tasks backport on Django 5.2): every
# @task's jobs run on Queuety's workers (docs/guide/tasks.md). "io" is the I/O lane's queue.
TASKS = {
    "default": {
        "BACKEND": "queuety.tasks_backend.QueuetyBackend",
        "QUEUES": ["default", "io"],
    },
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.BasicAuthentication",
    ],
}
# No DEFAULT_SCHEMA_CLASS or SPECTACULAR_SETTINGS: Queuety's views carry their own schema
# class, and its schema view its title and version.

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"queuety": {"handlers": ["console"], "level": os.environ.get(
        "QUEUETY_LOG_LEVEL", "WARNING")}},
}
