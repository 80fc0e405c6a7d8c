"""WSGI entry point: `gunicorn notifyqueue.wsgi`."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "notifyqueue.settings")

application = get_wsgi_application()
