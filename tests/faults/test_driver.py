"""The fault driver's exit status: a fenced driver is fenced even when stopping fails after it."""

from __future__ import annotations

import errno

from faults.driver import _disk_full, _in_chain
from millwheel.runtime._lease import FencedError


def _raised_while_stopping(first: BaseException, then: BaseException) -> BaseException:
    try:
        try:
            raise first
        finally:
            raise then
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        return exc


def test_a_fence_is_found_behind_an_error_raised_while_stopping():
    exc = _raised_while_stopping(
        FencedError("another driver took over"), OSError(errno.ENOSPC, "No space left on device")
    )
    assert isinstance(exc, OSError)
    assert str(_in_chain(exc, FencedError)) == "another driver took over"
    assert _disk_full(exc)


def test_a_full_disk_alone_is_not_a_fence():
    exc = _raised_while_stopping(
        RuntimeError("query failed"), OSError(errno.ENOSPC, "No space left on device")
    )
    assert _in_chain(exc, FencedError) is None
    assert _disk_full(exc)
    assert not _disk_full(RuntimeError("something else"))
