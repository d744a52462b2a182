import pytest


def _hopper_unavailable_reason():
    """``None`` when a Hopper GPU is usable, else why not."""
    try:
        from attnclimb import hopper_unavailable_reason

        return hopper_unavailable_reason()
    except Exception as exc:  # import problems must surface in the CPU tests, not here
        return f"attnclimb import failed: {exc}"


def pytest_collection_modifyitems(config, items):
    why = _hopper_unavailable_reason()
    if why is None:
        return
    skip = pytest.mark.skip(reason=f"needs a Hopper GPU: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
