"""WSGI entry point: `gunicorn notifyqueue.wsgi`. Django's application, with the create
endpoints' shortcut (notifyqueue/serving/shortcuts.py).

Production runs it with this project's gunicorn settings
(`gunicorn -c python:notifyqueue.gunicorn_conf`). Under a bare `gunicorn notifyqueue.wsgi`
it answers the same, but each process logs a warning once: gunicorn's default worker has no
defence against slow clients, and /metrics counts only the process that answers the scrape.
"""

import logging
import os
import sys

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "notifyqueue.settings")

django_application = get_wsgi_application()

# Imported once Django is set up: it imports middleware that needs the apps loaded.
from notifyqueue.serving.shortcuts import with_shortcuts  # noqa: E402

application = with_shortcuts(django_application)

# gunicorn imports the worker class that notifyqueue/gunicorn_conf.py names before it loads
# this module; without it, gunicorn runs with its own defaults.
if "gunicorn" in sys.modules and "notifyqueue.serving.gunicorn_worker" not in sys.modules:
    logging.getLogger(__name__).warning(
        "gunicorn runs without notifyqueue's settings: slow clients can hold its workers and "
        "/metrics counts only the process that answers. Start it as "
        "`gunicorn -c python:notifyqueue.gunicorn_conf` (docs/deploying.md)."
    )
