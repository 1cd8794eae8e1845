"""Photon samples, harnesses and registries shared by the tests of ``topologies/photon/``.

* ``sample`` — a generated sample (20 s, 150 queries/s: ~270 clicks with every
  difficulty of the generator), session-scoped, with its ``truth``; ``batch`` and
  ``continuous`` are its harness replays, made once;
* ``joiner`` — ``joiner(config=..., **options)``: a harness around the join topology with
  no sources (the test injects), once per joiner (columnar, per record); ``query`` /
  ``click`` build their records;
  ``union`` merges pipelines' outputs;
* ``registry`` — a real IdRegistry in this process (``id_registry``), as the backends use it;
  ``registry_service`` — the real service, for Spark pipelines in other processes;
  ``spark_sample`` — a smaller sample for Spark runs;
* ``pipelines`` — ``pipelines(data, registry, names)``: one harness pipeline per name over
  the same logs, fed in slices (``Stepper``), killable right after a registry commit.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from millwheel import Record, Source, SourceBatch
from millwheel.once import join_roster
from millwheel.testing import Harness
from topologies.photon import (
    GeneratorConfig,
    PhotonConfig,
    RunResult,
    build,
    generate,
    join_topology,
    replay,
)
from topologies.photon.registry import OnceRegistryAdapter

SAMPLE = GeneratorConfig(seed=5, duration_s=20, rate=150)


@pytest.fixture(scope="session")
def sample(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("photon-sample")
    generate(d, SAMPLE)
    return d


@pytest.fixture(scope="session")
def truth(sample) -> dict:
    return json.loads((sample / "ground_truth.json").read_text())


@pytest.fixture(scope="session")
def batch(sample) -> RunResult:
    return replay(sample, mode="batch")


@pytest.fixture(scope="session")
def continuous(sample) -> RunResult:
    return replay(sample, mode="continuous")


@pytest.fixture
def query():
    """``query(qid, ts, **fields)``: a query record as the query log injector makes it (record id = query id)."""

    def make(qid: str, ts: int, **fields: Any) -> Record:
        return Record(
            None, {"query_id": qid, "ts": ts, "advertiser_id": "adv-1", **fields}, ts, qid
        )

    return make


@pytest.fixture
def click():
    """``click(cid, qid, ts, **fields)``: a click record as the click log injector makes it (record id = click id)."""

    def make(cid: str, qid: str, ts: int, **fields: Any) -> Record:
        return Record(
            None, {"click_id": cid, "query_id": qid, "ts": ts, "ad_slot": 1, **fields}, ts, cid
        )

    return make


@pytest.fixture(params=["columnar", "per_record"])
def joiner(request):
    """``joiner(config=PhotonConfig(...), queries_dir=None, **harness options)``: the join topology in a harness;
    every test using it runs twice, with the columnar joiner (the default) and the per-record one."""
    columnar = request.param == "columnar"

    def make(
        config: PhotonConfig | None = None,
        *,
        queries_dir: Any = None,
        adapter: Any = None,
        reinjected: bool = False,
        **options: Any,
    ) -> Harness:
        sources = {"queries": None, "clicks": None, **({"reinjected": None} if reinjected else {})}
        cfg = dataclasses.replace(
            config or PhotonConfig(log_store=queries_dir is not None), columnar_joiner=columnar
        )
        h = Harness(
            join_topology(cfg, sources=sources, queries_dir=queries_dir, adapter=adapter), **options
        )
        if reinjected:
            h.finish(
                "reinjected"
            )  # as on a pipeline: the re-injection directory holds no watermark
        return h

    return make


@pytest.fixture(scope="session")
def spark_sample(tmp_path_factory) -> Path:
    """A smaller sample for Spark runs (~600 queries, ~55 clicks, every difficulty)."""
    d = tmp_path_factory.mktemp("photon-spark-sample")
    generate(
        d,
        GeneratorConfig(
            seed=8,
            duration_s=10,
            rate=60,
            orphan_click_fraction=0.03,
            duplicate_click_fraction=0.05,
        ),
    )
    return d


@pytest.fixture
def registry_service(tmp_path_factory):
    """The real IdRegistry service (``python -m id_registry serve``) on loopback, empty for each
    test: tests that run the same sample would otherwise find each other's click ids held
    (the two-pipeline test then saw every click "held by no known pipeline")."""
    from id_registry import embedded_registry

    with embedded_registry(str(tmp_path_factory.mktemp("photon-registry"))) as service:
        yield service


@pytest.fixture
def registry() -> Iterator[OnceRegistryAdapter]:
    from id_registry import InProcessRegistryClient

    client = InProcessRegistryClient()
    try:
        yield OnceRegistryAdapter(client)
    finally:
        client.close()


class Killed(Exception):
    """The pipeline's process died (simulated): raised from inside a registry call."""


class KillSwitch:
    """A pipeline's registry client that can kill the pipeline right after the registry answered a commit.

    That is Photon §3.3.2's loss: "the IdRegistry successfully registers the click id
    but [...] the joiner crashes before writing the joined click". The harness's round
    then stops before its checkpoint, as a process killed there would: nothing it did is
    visible, its input is not acknowledged.
    """

    def __init__(self, registry: Any) -> None:
        self.registry = registry
        self.calls = 0
        self.kill_at: int | None = None

    def __getattr__(self, name: str) -> Any:
        # the rest of the registry as it is: lookups, holders, clears (a join's take-over of a give-up)
        return getattr(self.registry, name)

    def commit_many(self, items: Any) -> Any:
        out = self.registry.commit_many(items)
        self.calls += 1
        if (
            self.kill_at is not None
            and self.calls >= self.kill_at
            and any(r.value == "committed" for r in out)
        ):
            self.kill_at = None
            raise Killed
        return out


class _Resumable(Source):
    """A source read in slices: each ``batches()`` call continues where the last one stopped,
    after at most ``budget`` batches (``None``: to the end)."""

    def __init__(self, inner: Source, name: str, stream: str) -> None:
        self._it = inner.batches(name, stream)
        self.budget: int | None = None

    def batches(self, injector: str = "", stream: str = "") -> Iterator[SourceBatch]:  # noqa: ARG002
        while self.budget is None or self.budget > 0:
            b = next(self._it, None)
            if b is None:
                return
            if self.budget is not None:
                self.budget -= 1
            yield b


class Stepper:
    """One harness pipeline over a sample's logs: ``Harness.run_sources`` in slices, killable mid-round."""

    def __init__(
        self, data: Path, registry: Any, name: str, config: PhotonConfig | None = None
    ) -> None:
        self.name = name
        self.config = config or PhotonConfig()
        t = build(data, config=self.config, reinject_dir=data / f"reinject-{name}")
        self.sources = {n: _Resumable(i.source, n, i.stream) for n, i in t.injectors.items()}
        t.injectors = {
            n: dataclasses.replace(i, source=self.sources[n]) for n, i in t.injectors.items()
        }
        self.switch = KillSwitch(registry)
        self.h = Harness(t, raise_errors=False, registry=self.switch, pipeline=name)
        #: the harness's epoch (its once-tokens name ``name#epoch``)
        self.epoch = self.h.pipeline_id.partition("#")[2]
        #: its place in the registry's roster, which it joins as a Spark pipeline's start does
        self.where = f"harness:{name}"
        join_roster(registry, name, self.epoch, self.where)
        self.dead = False
        #: click ids verification re-injected into it (a run directory's ``reinject/`` files)
        self.reinjected: set[str] = set()

    def run(self, batches: int | None = None, *, kill_at_commit: int | None = None) -> None:
        """Feed ``batches`` more batches per injector (all: ``None``); with ``kill_at_commit``, die
        right after the registry answers that registry call (counted from the pipeline's start)."""
        for s in self.sources.values():
            s.budget = batches
        self.switch.kill_at = kill_at_commit
        try:
            self.h.run_sources()
        except Killed:
            self.dead = True

    def restart(self) -> None:
        """The killed pipeline comes back: recovery scan, then its unacknowledged input again (§7.1)."""
        self.dead = False
        self.h.restart("Joiner")
        self.h.run()

    def reinject(self, clicks: list[dict]) -> None:
        self.reinjected.update(c["click_id"] for c in clicks)
        self.h.inject("reinjected", [Record(None, c, c["ts"], c["reinject_id"]) for c in clicks])
        self.h.run()

    def result(self) -> RunResult:
        h = self.h
        return RunResult(
            [dict(v) for v in h.values("joined_clicks")],
            [dict(v) for v in h.values("unjoinable")],
            [r.value.as_dict() for r in h.dead_letters()],
            {"Joiner": h.metrics("Joiner")},
        )


@pytest.fixture
def pipelines():
    """``pipelines(data, registry, ["dc1", "dc2"])``: a :class:`Stepper` per name, sharing ``registry``."""

    def make(
        data: Path, registry: Any, names: list[str], config: PhotonConfig | None = None
    ) -> list[Stepper]:
        return [Stepper(data, registry, n, config) for n in names]

    return make


@pytest.fixture
def union():
    """``union(*results)``: the outputs of several pipelines as one (dead letters of the first: each has them all)."""

    def merge(*results: RunResult) -> RunResult:
        return RunResult(
            [j for r in results for j in r.joined],
            [u for r in results for u in r.unjoinable],
            results[0].dead_letters,
            {},
        )

    return merge
