"""gunicorn settings for the API, the production command (docs/deploying.md):

    gunicorn -c python:notifyqueue.gunicorn_conf --bind 0.0.0.0:8000 --workers N

A module of the installed package, so it works from any folder; every other gunicorn option
may follow on the command line. (A bare `gunicorn notifyqueue.wsgi` also serves the API, with
gunicorn's defaults: no protection from slow clients, and /metrics counts only the process
that answers the scrape; notifyqueue/wsgi.py logs a warning saying so.)

Slow clients: the worker reads each request whole, without blocking, before a thread takes
it, and closes a connection whose request has not arrived within its deadline
(notifyqueue/serving/gunicorn_worker.py).

/metrics must report the whole API, not whichever worker process answers the scrape. So every
process writes its counters into PROMETHEUS_MULTIPROC_DIR (prometheus_client's multi-process
mode) and any one of them serves the sum (health/views.py). This file

- uses PROMETHEUS_MULTIPROC_DIR when it is set (it must be empty when gunicorn starts; workers
  of `manage.py run_worker` on the same host may share it), else creates a fresh directory for
  this run and removes it at exit;
- tells prometheus_client when a worker process exits (`child_exit`), as django-prometheus and
  prometheus_client document, so its live gauges are dropped;
- freezes, in each worker once the application is loaded, what that start built out of the
  garbage collector's sight (`post_worker_init`; docs/decisions/0023-start-up-objects-frozen.md).

The variable is set here, before any worker imports prometheus_client (its value store is
chosen at import), and the hook imports prometheus_client only when it runs.

The worker is gunicorn's threaded one, reading requests whole in its main thread, whose threads
stay on a kept-alive connection for its next request (notifyqueue/serving/gunicorn_worker.py);
`--threads N` sets its threads (default 1).
"""

import gc
import os
import shutil
import tempfile

wsgi_app = "notifyqueue.wsgi:application"
worker_class = "notifyqueue.serving.gunicorn_worker.LingeringThreadWorker"

_metrics_dir_made_here = None
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    _metrics_dir_made_here = tempfile.mkdtemp(prefix="notifyqueue-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _metrics_dir_made_here


def post_worker_init(worker):
    # What the application's start built lives as long as the process: out of the
    # collector's sight, a full collection no longer walks it, holding every thread of the
    # process, for 100-300 ms (docs/decisions/0023-start-up-objects-frozen.md).
    gc.freeze()


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    if _metrics_dir_made_here:
        shutil.rmtree(_metrics_dir_made_here, ignore_errors=True)
