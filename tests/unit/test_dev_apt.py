"""dev.py's reading of `apt-get install --simulate`: what it would install, and what it would
upgrade (then it installs nothing)."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("dev", Path(__file__).parents[2] / "dev.py")
dev = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dev)

SIMULATED = """\
NOTE: This is only a simulation!
Reading package lists...
Inst libluajit-5.1-common (2.1.0~beta3+git20220320+dfsg-4.1+deb12u1 Debian:12.15/oldstable [all])
Inst libsystemd0 [252.30-1~deb12u2] (252.31-1~deb12u1 Debian:12.15/oldstable [amd64])
Inst wrk (4.1.0-3+b2 Debian:12.15/oldstable [amd64])
Conf libluajit-5.1-common (2.1.0~beta3+git20220320+dfsg-4.1+deb12u1 Debian:12.15/oldstable [all])
Conf wrk (4.1.0-3+b2 Debian:12.15/oldstable [amd64])
"""


def test_new_packages_and_upgrades_are_told_apart():
    assert dev.apt_plan(SIMULATED) == (["libluajit-5.1-common", "wrk"], ["libsystemd0"])


def test_nothing_to_do_is_an_empty_plan():
    assert dev.apt_plan("Reading package lists...\n0 upgraded, 0 newly installed.\n") == ([], [])
