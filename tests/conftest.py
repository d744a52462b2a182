import sys

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


def _forget_calls():
    ops = sys.modules.get("attnclimb.ops")
    if ops is not None:
        ops._FAST.clear()


@pytest.fixture(autouse=True)
def _no_remembered_calls():
    """The drop-in's fast path (``attnclimb.ops._FAST``) remembers calls with their launch plans, which CPU
    tests build with stand-ins for the GPU: every test starts and ends without any."""
    _forget_calls()
    yield
    _forget_calls()
