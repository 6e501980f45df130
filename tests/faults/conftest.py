import pytest
from shoal.local.network import preflight


def pytest_collection_modifyitems(items):
    missing = preflight.missing()
    for item in items:
        if "tests/faults/" in str(item.fspath):
            item.add_marker(pytest.mark.faults)
            item.add_marker(pytest.mark.slow)
            if missing:
                item.add_marker(pytest.mark.skip(reason="; ".join(missing)))
