import pytest

from freetoken.host import kernels as hk


@pytest.fixture(autouse=True)
def _host_defaults():
    """Each test starts from the default thread count and activation rule, whatever the one before set."""
    hk.set_threads(None)
    on = hk.int8_acts()
    yield
    hk.set_threads(None)
    hk.set_int8_acts(on)


def native_or_skip():
    if not hk.available():  # a machine without a C compiler runs the torch fallback, tested elsewhere
        pytest.skip(f"host kernels not built: {hk.unavailable_reason()}")
