"""Debian's chromium for the browser tests (python3 dev.py test installs it; never a browser
download; the `chromium` fixture in conftest.py skips without it), and the flags it runs with
on a machine with no network but loopback."""

from __future__ import annotations

from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
