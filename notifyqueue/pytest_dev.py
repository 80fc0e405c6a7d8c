"""pytest plugin (registered as a `pytest11` entry point): tests run in development mode.

pytest loads it before pytest-django reads the settings, so a plain `pytest` in the project's
virtualenv may start the embedded PostgreSQL when DATABASE_URL is unset, exactly as
`python3 dev.py test` does. It changes nothing outside a pytest run.
"""

import os

os.environ.setdefault("NOTIFYQUEUE_DEV_EMBEDDED_DB", "1")
