"""The fault tests' forkserver (started by the first test that needs it) ends with the session."""

import pytest


@pytest.fixture(scope="session", autouse=True)
def _forkserver_ends_with_the_session():
    yield
    import faultharness

    faultharness.stop_forkserver()
