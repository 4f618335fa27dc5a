"""Fixtures shared by the import tests; each module brings its own `registry`.
The machine-wide state the container tests need is set here, once per run."""

import os
import stat

import pytest

from container_fixture import app, berth, images, library, make_user, usable_fuse, user  # noqa: F401 (for every module)
from registry_fixture import Proxy, berth_env


@pytest.fixture
def proxy(registry):
    """The module's registry behind a proxy the test may stop or slow down."""
    proxy = Proxy(registry.url)
    yield proxy
    proxy.stop()


@pytest.fixture
def env(tmp_path):
    return berth_env(tmp_path)


_FUSE_MODE = pytest.StashKey[int]()


def _controller(config):
    """The process that starts and outlives every xdist worker (or the only one)."""
    return not hasattr(config, "workerinput")


def pytest_sessionstart(session):
    """The test user made, and /dev/fuse at 0666 (users mount images with
    FUSE) for the whole run, before any worker starts; /dev/fuse restored
    after the last one ends."""
    if os.geteuid() == 0 and _controller(session.config):
        make_user()
    if os.geteuid() == 0 and _controller(session.config) and os.path.exists("/dev/fuse"):
        session.config.stash[_FUSE_MODE] = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
        os.chmod("/dev/fuse", 0o666)


def pytest_sessionfinish(session):
    mode = session.config.stash.get(_FUSE_MODE, None)
    if mode is not None:
        os.chmod("/dev/fuse", mode)
