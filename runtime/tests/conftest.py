"""Fixtures shared by the import tests; each module brings its own `registry`."""

import pytest

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
