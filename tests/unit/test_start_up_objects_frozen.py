"""Long-running processes freeze what their start built out of the garbage collector's sight
(docs/decisions/0023-start-up-objects-frozen.md): a full collection walked it, holding every
thread of the process, for 70-300 ms. Each API worker freezes once the application is loaded;
each delivery worker before its loop starts (tests/integration/test_worker_edges.py)."""

from __future__ import annotations

import gc
import importlib


def test_each_api_worker_freezes_once_the_application_is_loaded(monkeypatch, tmp_path):
    # Set, so importing the settings module makes no metrics directory of its own.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    gunicorn_conf = importlib.import_module("notifyqueue.gunicorn_conf")
    frozen: list[bool] = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(True))
    gunicorn_conf.post_worker_init(worker=None)
    assert frozen == [True]
