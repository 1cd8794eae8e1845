"""Injector low watermarks from an expected set of processes (MillWheel §5.2)."""

from __future__ import annotations

import pytest

from watermark_authority import MAX_TIMESTAMP, MIN_TIMESTAMP, ConflictError, UnknownNameError


def test_a_missing_expected_process_holds_the_injector(client, ns):
    inj = f"{ns}logs"
    client.expect_injector_processes(inj, ["p0", "p1", "p2"])
    assert client.watermark(inj) == MIN_TIMESTAMP
    client.report_injector(inj, "p0", 5_000)
    client.report_injector(inj, "p1", 6_000)
    assert client.watermark(inj) == MIN_TIMESTAMP  # p2 never reported
    client.report_injector(inj, "p2", 7_000)
    assert client.watermark(inj) == 5_000
    client.report_injector(inj, "p0", 9_000)  # p1 goes silent at 6_000: it holds
    client.report_injector(inj, "p2", 9_000)
    assert client.watermark(inj) == 6_000
    assert client.watermarks()[inj] == 6_000


def test_without_an_expected_set_the_reporters_are_the_set(client, ns):
    inj = f"{ns}logs"
    client.report_injector(inj, "p0", 5_000)
    assert client.watermark(inj) == 5_000
    client.report_injector(inj, "p1", 7_000)
    assert client.watermark(inj) == 5_000


def test_a_process_outside_the_expected_set_is_refused(client, ns):
    inj = f"{ns}logs"
    client.expect_injector_processes(inj, ["p0"])
    with pytest.raises(UnknownNameError, match="expect_injector_processes"):
        client.report_injector(inj, "p9", 5_000)
    assert client.watermark(inj) == MIN_TIMESTAMP


def test_shrinking_the_expected_set_forgets_the_removed_process(client, ns):
    inj = f"{ns}logs"
    client.expect_injector_processes(inj, ["p0", "p1"])
    client.report_injector(inj, "p0", 9_000)
    client.report_injector(inj, "p1", 4_000)
    assert client.watermark(inj) == 4_000
    client.expect_injector_processes(inj, ["p0"])  # p1 was decommissioned
    assert client.watermark(inj) == 9_000
    client.report_injector(inj, "p0", MAX_TIMESTAMP)
    assert client.watermark(inj) == MAX_TIMESTAMP


def test_computations_and_injectors_share_one_namespace(client, ns):
    client.acquire(f"{ns}x", "a")
    with pytest.raises(ConflictError, match="namespace"):
        client.report_injector(f"{ns}x", "p0", 1)
    client.report_injector(f"{ns}y", "p0", 1)
    with pytest.raises(ConflictError):
        client.acquire(f"{ns}y", "a")
