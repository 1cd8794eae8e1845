"""kill -9 of the authority during a stream of reports, then a restart on the same journal (§7.2).

Every value broadcast before the kill must still be at most the value broadcast after it,
every acknowledged report must still be there, and a fenced token must stay fenced.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from watermark_authority import AuthorityError, StaleTokenError
from watermark_authority.client import start_authority

COMPUTATIONS = ["crash-a", "crash-b"]
INTERVALS = [f"i{k}" for k in range(16)]


@pytest.mark.timeout(120)
def test_kill_9_mid_stream_then_restart_never_goes_back(tmp_path):
    crash_loop(tmp_path, cycles=3, seed=11)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill_9_soak(tmp_path):  # a 40-cycle soak, about a minute
    crash_loop(tmp_path, cycles=40, seed=12)


def crash_loop(tmp_path, *, cycles: int, seed: int) -> None:
    """Send reports and read watermarks, kill -9 the service at a random moment, restart, check; ``cycles`` times."""
    rng = random.Random(seed)
    data_dir = str(tmp_path / "authority")
    svc = start_authority(data_dir)
    try:
        with svc.client(retries=0, timeout=5.0) as c:
            tokens = {comp: c.acquire_many(comp, INTERVALS) for comp in COMPUTATIONS}
            zombie = {comp: dict(t) for comp, t in tokens.items()}
            for comp in COMPUTATIONS:  # fence one interval's first owner
                tokens[comp]["i0"] = c.acquire(comp, "i0")
        broadcast: dict[str, int] = dict.fromkeys(
            COMPUTATIONS, -(2**63)
        )  # highest value seen published
        acked: dict[tuple[str, str], int] = {}  # last acknowledged report per interval
        acks = [0]  # acknowledged batches, all cycles
        clock = {comp: 1_000 for comp in COMPUTATIONS}

        for cycle in range(cycles):
            stop = threading.Event()
            in_flight: dict[tuple[str, str], int] = {}

            def writer(client, stop=stop, in_flight=in_flight) -> None:
                while not stop.is_set():
                    comp = rng.choice(COMPUTATIONS)
                    clock[comp] += rng.randint(0, 50)
                    batch = []
                    for iv in rng.sample(INTERVALS, 6):
                        late = rng.random() < 0.2  # some reports go back in time
                        batch.append(
                            (
                                iv,
                                tokens[comp][iv],
                                clock[comp] - (rng.randint(0, 500) if late else 0),
                            )
                        )
                    for iv, _, v in batch:
                        in_flight[(comp, iv)] = v
                    try:
                        client.report_batch(comp, batch)
                    except AuthorityError:
                        return
                    for iv, _, v in batch:
                        acked[(comp, iv)] = v
                        in_flight.pop((comp, iv), None)
                    acks[0] += 1

            def reader(client, stop=stop) -> None:
                while not stop.is_set():
                    try:
                        marks = client.watermarks()
                    except AuthorityError:
                        return
                    for comp in COMPUTATIONS:
                        broadcast[comp] = max(broadcast[comp], marks.get(comp, -(2**63)))

            w_client, r_client = (
                svc.client(retries=0, timeout=5.0),
                svc.client(retries=0, timeout=5.0),
            )
            threads = [
                threading.Thread(target=writer, args=(w_client,)),
                threading.Thread(target=reader, args=(r_client,)),
            ]
            for t in threads:
                t.start()
            # kill by progress, not by seconds: once some reports are acknowledged and a
            # watermark was broadcast, after a random number of further acknowledgements
            target = acks[0] + 3 + rng.randint(0, 20)
            deadline = time.monotonic() + 60
            while (
                acks[0] < target or not all(v > -(2**63) for v in broadcast.values())
            ) and time.monotonic() < deadline:
                time.sleep(0.005)
            svc.kill()  # SIGKILL mid-stream
            stop.set()
            for t in threads:
                t.join(10)
            assert acked, f"cycle {cycle}: no report was acknowledged before the kill"
            assert all(v > -(2**63) for v in broadcast.values()), (
                f"cycle {cycle}: nothing was broadcast"
            )

            svc = start_authority(data_dir)
            with svc.client(retries=2) as c:
                after = c.watermarks()
                for comp in COMPUTATIONS:
                    assert after[comp] >= broadcast[comp], (
                        f"cycle {cycle}: {comp} went back from {broadcast[comp]} to {after[comp]}"
                    )
                    intervals = c._call("GET", "/v1/intervals", params={"computation": comp})[
                        "intervals"
                    ]
                    for iv in INTERVALS:
                        got = intervals[iv]["value"]
                        expected = {acked.get((comp, iv), -(2**63)), in_flight.get((comp, iv))}
                        assert got in expected, (
                            f"cycle {cycle}: {comp}/{iv} restored {got}, acknowledged {expected}"
                        )
                        # a report in flight at the kill may have been journaled: what came
                        # back is what the next cycle's expectations start from
                        acked[(comp, iv)] = got
                    with pytest.raises(StaleTokenError):
                        c.report(comp, "i0", zombie[comp]["i0"], 10**12)
    finally:
        svc.stop()
