"""`manage.py` and the `notifyqueue` console script: Django's command line for this project.

A missing production setting (DATABASE_URL, DJANGO_SECRET_KEY) ends the command with its
message and exit status 1, not a traceback. Output into a pipe its reader closed early
(`notifyqueue queue_status | head`) ends the command quietly with status 141, as a process
ended by SIGPIPE would.
"""

from __future__ import annotations

import os
import sys
from signal import SIGPIPE


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "notifyqueue.settings")
    from django.core.exceptions import AppRegistryNotReady, ImproperlyConfigured
    from django.core.management import execute_from_command_line

    argv = argv if argv is not None else sys.argv
    try:
        try:
            execute_from_command_line(argv)
        finally:
            # What is still buffered goes out now (also on the way out of a command that
            # failed), where a closed pipe can be handled.
            sys.stdout.flush()
    except BrokenPipeError:
        _quiet_after_broken_pipe()
    except ImproperlyConfigured as exc:
        _stop(argv, exc)
    except AppRegistryNotReady:
        # Django's own commands (makemigrations...) run on after the settings failed to load,
        # and then fail for want of the apps: the settings' message is the one to give. Any
        # other cause is a bug, and keeps its traceback.
        problem = _settings_problem()
        if problem is None:
            raise
        _stop(argv, problem)


def _quiet_after_broken_pipe() -> None:
    # The interpreter flushes stdout once more on its way out; pointed at /dev/null, that flush
    # has nowhere to fail (the recipe of Python's signal module documentation).
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(128 + SIGPIPE)


def _stop(argv: list[str], problem: Exception) -> None:
    print(f"{os.path.basename(argv[0])}: {problem}", file=sys.stderr)
    sys.exit(1)


def _settings_problem() -> Exception | None:
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        settings.INSTALLED_APPS  # noqa: B018 (loads the settings module)
    except ImproperlyConfigured as exc:
        return exc
    return None
