import pytest


def _hopper():
    try:
        from attnclimb import hopper_available

        return hopper_available()
    except Exception as exc:  # import problems must surface in the CPU tests, not here
        return False, f"attnclimb import failed: {exc}"


def pytest_collection_modifyitems(config, items):
    ok, why = _hopper()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"needs a Hopper GPU: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
