import pytest

from freetoken.host import kernels as hk


@pytest.fixture(autouse=True)
def _host_defaults():
    """Each test starts from the default thread count, whatever the one before set."""
    hk.set_threads(None)
    yield
    hk.set_threads(None)


def native_or_skip():
    if not hk.available():  # a machine without a C compiler runs the torch fallback, tested elsewhere
        pytest.skip(f"host kernels not built: {hk.unavailable_reason()}")
