"""WSGI entry point: `gunicorn notifyqueue.wsgi`. Django's application, with the create
endpoints' shortcut (notifyqueue/shortcuts.py)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "notifyqueue.settings")

django_application = get_wsgi_application()

# Imported once Django is set up: it imports middleware that needs the apps loaded.
from notifyqueue.shortcuts import with_shortcuts  # noqa: E402

application = with_shortcuts(django_application)
