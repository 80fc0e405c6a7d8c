"""The worker's frozen gunicorn config (notifyqueue/serving/gunicorn_worker.py,
`config_freeze`) reads every setting as gunicorn's own Config does, without its `__getattr__`."""

from __future__ import annotations

import pytest
from gunicorn.config import Config
from gunicorn.workers.gthread import ThreadWorker

from notifyqueue.serving.gunicorn_worker import LingeringThreadWorker, config_freeze


def _config() -> Config:
    cfg = Config()
    # Settings away from their defaults, as gunicorn_conf.py and the command line set them.
    cfg.set("threads", 4)
    cfg.set("forwarded_allow_ips", "10.0.0.1,127.0.0.1")
    cfg.set("limit_request_line", 1234)
    cfg.set("worker_class", "notifyqueue.serving.gunicorn_worker.LingeringThreadWorker")
    return cfg


def test_every_setting_reads_the_same_once_frozen():
    cfg = _config()
    before = {name: getattr(cfg, name) for name in cfg.settings}
    config_freeze(cfg)
    assert {name: getattr(cfg, name) for name in cfg.settings} == before
    assert cfg.threads == 4 and cfg.limit_request_line == 1234
    assert [str(n) for n in cfg.forwarded_allow_networks()] == ["10.0.0.1/32", "127.0.0.1/32"]


def test_a_frozen_setting_is_read_without_the_configs_getattr(monkeypatch):
    cfg = _config()
    config_freeze(cfg)

    def refuse(self, name):
        raise AssertionError(f"Config.__getattr__ asked for {name}")

    monkeypatch.setattr(Config, "__getattr__", refuse)
    assert cfg.limit_request_line == 1234
    assert cfg.secure_scheme_headers == _config().settings["secure_scheme_headers"].get()


@pytest.mark.parametrize("name", ["worker_class", "proc_name", "sendfile", "reuse_port"])
def test_what_the_class_computes_is_left_to_the_class(name):
    cfg = _config()
    expected = getattr(cfg, name)
    config_freeze(cfg)
    assert name not in vars(cfg)
    assert getattr(cfg, name) == expected


def test_the_worker_freezes_its_settings_as_its_process_starts(monkeypatch):
    """`init_process` runs in the worker's own process, after the fork: the master's config
    (which a reload replaces) is left as gunicorn made it."""
    monkeypatch.setattr(ThreadWorker, "init_process", lambda self: None)
    worker = object.__new__(LingeringThreadWorker)
    worker.cfg = _config()
    assert "limit_request_line" not in vars(worker.cfg)
    worker.init_process()
    assert vars(worker.cfg)["limit_request_line"] == 1234
