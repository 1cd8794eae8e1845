"""Multi-homing, verification and recovery (topologies/photon/verify.py; Photon §2, §3.3.2, §3.3.3).

Two harness pipelines read the same logs and share one IdRegistry (``id_registry``, in
process). ``dc1`` is killed right after the registry answers a commit — the click ids
are registered, the joined events were never written — and ``dc2`` carries on without
any action. The union of the two outputs then lacks exactly those clicks (``dc2`` got a
conflict for each), until either verification recovers them into ``dc2``, or ``dc1``
comes back and replays its batch under the same token.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millwheel.once import roster
from topologies.photon import PhotonConfig, Pipeline, evaluate, verify
from topologies.photon.verify import token
from topologies.photon.verify_runs import gave_up_ids, output_ids


def _pipeline(p, *, running=False, has_query=None):
    r = p.result()
    return Pipeline(
        p.name,
        output_ids(r.joined, r.unjoinable),
        running=running,
        reinject=p.reinject,
        gave_up=gave_up_ids(r.unjoinable),
        epoch=p.epoch,
        where=p.where,
        offered=set(p.reinjected),
        has_query=has_query,
    )


def _clicks(sample):
    from topologies.photon.evaluation import read_records

    return read_records(sample / "clicks", "click_id", "ts")[0]


def _kept_tokens(registry, sample) -> list[str]:
    """The give-ups' tentative tokens, which ``clear_tokens`` keeps: a join may still take
    their ids over."""
    from millwheel.once import TENTATIVE

    ids = [c["click_id"] for c in _clicks(sample)]
    return [t for r in registry.lookup_many(ids) if (t := r.token) and t.endswith(TENTATIVE)]


@pytest.mark.parametrize("kill_at", [1, 3, 7])
def test_a_killed_pipeline_loses_nothing_after_verification_and_its_restart_duplicates_nothing(
    kill_at, sample, truth, registry, pipelines, union
):
    dc1, dc2 = pipelines(sample, registry, ["dc1", "dc2"])
    dc1.run(kill_at_commit=kill_at)
    assert dc1.dead
    dc2.run()  # no operator action: dc2 just goes on
    lost = evaluate(union(dc2.result(), dc1.result()), sample, truth)
    assert (
        lost["duplicates_in_output"] == 0 and lost["joined"]["missing"] > 0
    )  # at most once, not yet exactly once
    # verification: the missing clicks are registered under dc1's token, and dc1 is not running
    report = verify(
        _clicks(sample), [_pipeline(dc1), _pipeline(dc2, running=True)], registry, clear_tokens=True
    )
    assert report.missing == report.recovered > 0 and report.reinjected_into == {
        "dc2": report.recovered
    }
    assert report.in_flight == report.holder_not_given == report.duplicated == 0
    assert report.tokens_cleared == report.in_output - len(_kept_tokens(registry, sample))
    healed = evaluate(union(dc2.result(), dc1.result()), sample, truth)
    assert healed["ok"], healed
    # a second verification finds nothing to do
    again = verify(_clicks(sample), [_pipeline(dc1), _pipeline(dc2, running=True)], registry)
    assert (
        again.missing == again.recovered == 0
        and again.in_output == report.in_output + report.recovered
    )
    # dc1 comes back: it replays its batch and reads the rest of the logs, and writes nothing twice
    dc1.restart()
    dc1.run()
    final = evaluate(union(dc2.result(), dc1.result()), sample, truth)
    assert final["ok"], final
    assert dc1.result().metrics["Joiner"]["once_conflicts"] > 0


def test_a_restarted_pipeline_writes_what_it_registered_without_verification(
    sample, truth, registry, pipelines, union
):
    """The token is derived from the pipeline, so its replay commits the same ids again (§3.3.2)."""
    dc1, dc2 = pipelines(sample, registry, ["dc1", "dc2"])
    dc1.run(kill_at_commit=4)
    dc2.run()
    assert evaluate(union(dc2.result(), dc1.result()), sample, truth)["joined"]["missing"] > 0
    dc1.restart()
    dc1.run()
    final = evaluate(union(dc2.result(), dc1.result()), sample, truth)
    assert final["ok"], final


def test_clicks_held_by_a_running_pipeline_are_in_flight_and_left_alone(
    sample, registry, pipelines
):
    dc1, dc2 = pipelines(sample, registry, ["dc1", "dc2"])
    dc1.run(kill_at_commit=2)
    report = verify(_clicks(sample), [_pipeline(dc1, running=True), _pipeline(dc2)], registry)
    assert report.missing == report.in_flight > 0 and report.recovered == 0
    assert dc2.result().joined == []  # nothing was re-injected


def test_dry_run_reports_and_changes_nothing(sample, registry, pipelines):
    dc1, dc2 = pipelines(sample, registry, ["dc1", "dc2"])
    dc1.run(kill_at_commit=2)
    dc2.run(batches=4)
    clicks = _clicks(sample)
    before = [r.token for r in registry.lookup_many([c["click_id"] for c in clicks])]
    report = verify(clicks, [_pipeline(dc1), _pipeline(dc2, running=True)], registry, dry_run=True)
    assert report.recovered > 0 and report.dry_run and "dry run: nothing changed" in report.text()
    assert [r.token for r in registry.lookup_many([c["click_id"] for c in clicks])] == before


def test_a_click_held_by_an_unknown_joiner_is_reported_not_touched(sample, registry):
    clicks = _clicks(sample)[:1]
    c = clicks[0]
    registry.commit_many([(c["click_id"], token("dc9", c["query_id"]), c["ts"])])
    out: list = []
    report = verify(clicks, [Pipeline("dc1", set(), reinject=out.extend)], registry)
    assert report.holder_not_given == 1 and out == []


@pytest.mark.parametrize("cleared_first", [True, False])
def test_verifying_a_subset_of_the_runs_duplicates_nothing(
    cleared_first, sample, truth, registry, pipelines, union
):
    # ``verify A B`` once cleared the tokens of safe clicks; a later ``verify A``
    # took B's clicks for lost output and re-injected them into A, which wrote them again
    dc1, dc2 = pipelines(sample, registry, ["dc1", "dc2"])
    dc1.run(batches=2)
    dc2.run()
    dc1.run()
    assert evaluate(union(dc2.result(), dc1.result()), sample, truth)["ok"]
    if cleared_first:
        both = verify(
            _clicks(sample), [_pipeline(dc1), _pipeline(dc2)], registry, clear_tokens=True
        )
        kept = _kept_tokens(registry, sample)
        assert both.tokens_cleared == both.in_output - len(kept) > 0 and both.recovered == 0
    alone = verify(_clicks(sample), [_pipeline(dc1)], registry)
    assert alone.recovered == 0 and alone.reinjected_into == {}
    assert alone.missing == len(dc2.result().joined) + len(
        [u for u in dc2.result().unjoinable if u["reason_code"] != "too_old"]
    )
    # a cleared token leaves the id held by nobody; a give-up's tentative token is kept
    kept = len(_kept_tokens(registry, sample)) if cleared_first else alone.missing
    assert (alone.holder_not_given, alone.cleared_elsewhere) == (kept, alone.missing - kept)
    final = evaluate(union(dc2.result(), dc1.result()), sample, truth)
    assert final["ok"] and final["duplicates_in_output"] == 0, final


@pytest.mark.parametrize("staged", [True, False])
def test_a_batch_committed_but_not_published_counts_as_output(staged, tmp_path, sample, registry):
    # before: a pipeline killed between Spark's commit and its publication: verification
    # took its clicks for lost, re-injected them into the other pipeline, and the restart
    # published the staged batch too
    import pyarrow as pa
    import pyarrow.parquet as pq

    from millwheel._codec import encode_value
    from millwheel.once import join_roster
    from millwheel.runtime._fs import Location
    from millwheel.runtime._runtime import where_of
    from topologies.photon.drivers import prepare_run
    from topologies.photon.evaluation import batch_join
    from topologies.photon.verify_runs import verify_runs

    joined = batch_join(sample).joined[0]
    runs = []
    for name in ("dc1", "dc2"):
        run = tmp_path / name
        prepare_run(run, sample, PhotonConfig(), name, None)
        (run / "run.json").write_text(json.dumps({"pipeline": name, "epoch": f"e-{name}"}))
        join_roster(registry, name, f"e-{name}", where_of(Location.of(str(run))))
        runs.append(run)
    registry.commit_many(
        [(joined["click_id"], token("dc1#e-dc1", joined["query_id"]), joined["click_ts"])]
    )
    batch = runs[0] / "outbox" / "Joiner" / "5"
    (runs[0] / "checkpoints" / "Joiner" / "commits").mkdir(parents=True)
    (runs[0] / "checkpoints" / "Joiner" / "commits" / "5").write_text("v1\n{}")
    (runs[0] / "tallies").mkdir()
    (runs[0] / "tallies" / "Joiner.json").write_text(
        json.dumps({"published": 4, "written_by_stream": {}, "metrics": {}})
    )
    if staged:
        part = batch / "e0" / "stream=joined_clicks"
        part.mkdir(parents=True)
        pq.write_table(
            pa.table(
                {
                    "id": ["p1"],
                    "ts": [joined["click_ts"]],
                    "key": [None],
                    "value": [encode_value(joined)],
                    "wm": [None],
                },
                schema=pa.schema(
                    [
                        ("id", pa.string()),
                        ("ts", pa.int64()),
                        ("key", pa.binary()),
                        ("value", pa.binary()),
                        ("wm", pa.int64()),
                    ]
                ),
            ),
            part / "part-00000.parquet",
        )
    report = verify_runs(runs, registry)
    assert report.missing == (0 if staged else 1) and report.recovered == (0 if staged else 1)
    assert len(list((runs[1] / "reinject").glob("reinject_*.jsonl"))) == (
        0 if staged else 1
    )  # nothing re-injected


def _members(registry, *pipelines):
    """Each pipeline enters the registry's roster, as its start does (``millwheel/_once.py``)."""
    from millwheel.once import join_roster

    for p in pipelines:
        join_roster(registry, p.name, p.epoch, p.where)


def test_a_click_a_running_pipeline_gave_up_is_not_reinjected_into_it(sample, registry):
    # before: dc1 joined the click and died before writing it; dc2, running, had given it up from
    # its own log. Verification cleared dc1's id and re-injected the click into dc2, which gave it
    # up a second time: the same id twice in unjoinable
    (c, *_) = _clicks(sample)
    into1: list = []
    into2: list = []
    dc1 = Pipeline("dc1", set(), epoch="e1", where="h:/runs/dc1", reinject=into1.extend)
    dc2 = Pipeline(
        "dc2",
        set(),
        running=True,
        gave_up={c["click_id"]},
        epoch="e2",
        where="h:/runs/dc2",
        reinject=into2.extend,
    )
    _members(registry, dc1, dc2)
    registry.commit_many([(c["click_id"], token("dc1#e1", c["query_id"]), c["ts"])])
    report = verify([c], [dc1, dc2], registry)
    assert into2 == []
    assert [x["click_id"] for x in into1] == [
        c["click_id"]
    ]  # the holder's own directory: its restart joins it
    assert report.recovered == 1 and report.reinjected_into == {"dc1": 1}


def test_a_click_given_up_where_it_was_reinjected_is_offered_to_a_pipeline_refused_by_its_dead_holder(
    tmp_path, sample, truth, registry, pipelines, union
):
    # the long check's failed round (seed 402535468, round 1): dc2 registered clicks and lost
    # its checkpoint; its new epoch's joins of them were refused by the old epoch's tokens.
    # Verification cleared those and re-injected the clicks into dc1 (the --target), whose
    # queries were late: dc1 gave them up (tentatively) and nobody joined them — lost
    import shutil

    from topologies.photon.verify_runs import query_finder

    late = tmp_path / "data-dc1"  # dc1's copy of the logs: the clicks, its queries not yet
    shutil.copytree(sample, late, ignore=shutil.ignore_patterns("queries_*"))
    (old,) = pipelines(sample, registry, ["dc2"])
    old.run(kill_at_commit=2)
    assert old.dead
    (dc1,) = pipelines(late, registry, ["dc1"])
    dc1.run()
    (dc2,) = pipelines(sample, registry, ["dc2"])  # a new epoch in the same place
    dc2.run()
    clicks, config = _clicks(sample), PhotonConfig()
    has1, has2 = query_finder(late, config), query_finder(sample, config)

    def both():
        return [
            _pipeline(dc1, running=True, has_query=has1),
            _pipeline(dc2, running=True, has_query=has2),
        ]

    first = verify(clicks, both(), registry, target="dc1")
    assert first.recovered > 0 and first.reinjected_into == {"dc1": first.recovered}
    given_up = (
        {c["click_id"] for c in clicks} & dc1.reinjected & gave_up_ids(dc1.result().unjoinable)
    )
    assert given_up, "dc1 could join none of them: it gives them up"
    # given up by dc1, refused in dc2 by a holder since cleared: offered to dc2, which has the
    # queries (never to dc1, which decided them), the registry left as it is
    # (read by dc2 after verification, as a run directory's reinject/ file is, after the
    # tokens of the clicks safely joined were cleared: a give-up keeps its token)
    offered: list[dict] = []
    deferred = [*both()[:1], dataclasses.replace(both()[1], reinject=offered.extend)]
    second = verify(clicks, deferred, registry, clear_tokens=True)
    assert second.recovered == 0 and second.offered_into == {"dc2": len(given_up)}
    assert second.tokens_cleared > 0
    dc2.reinject(offered)
    assert dc2.reinjected == given_up
    assert (
        f"offered to a member with the query: {len(given_up)}; {len(given_up)} into dc2"
        in second.text()
    )
    final = evaluate(union(dc2.result(), dc1.result()), sample, truth)
    assert final["joined"]["missing"] == 0 and final["duplicates_in_output"] == 0, final
    assert dc2.result().metrics["Joiner"]["once_conflicts"] > 0
    # each member is offered a click once: nothing more to do
    third = verify(clicks, both(), registry)
    assert third.offered == third.recovered == 0


def _leftover_of_a_refused_start(run, sample, name, epoch):
    """What ``photon run --checkpoint RUN --pipeline NAME`` left when the registry refused NAME (before
    the fix): a manifest and an identity, as if RUN were a pipeline."""
    from topologies.photon.drivers import prepare_run

    prepare_run(run, sample, PhotonConfig(), name, None)
    (run / "run.json").write_text(json.dumps({"pipeline": name, "epoch": epoch}))


def test_verification_reinjects_only_into_a_member_of_the_roster_and_names_its_directory(
    tmp_path, sample, registry
):
    # before: `verify Y A` re-injected A's lost clicks into Y, a directory whose start was refused
    # (A holds the name dc1): they were stranded there for good
    from millwheel.once import join_roster
    from millwheel.runtime._fs import Location
    from millwheel.runtime._runtime import where_of
    from topologies.photon.verify_runs import verify_runs

    a, y = tmp_path / "a", tmp_path / "y"
    _leftover_of_a_refused_start(
        a, sample, "dc1", "eA"
    )  # A ran: its manifest and identity are real
    join_roster(registry, "dc1", "eA", where_of(Location.of(str(a))))
    _leftover_of_a_refused_start(y, sample, "dc1", "eY")  # Y: refused, never a member
    clicks = _clicks(sample)[:10]
    registry.commit_many(
        [(c["click_id"], token("dc1#eA", c["query_id"]), c["ts"]) for c in clicks[:5]]
    )
    report = verify_runs([y, a], registry)
    assert not list((y / "reinject").glob("reinject_*.jsonl"))
    assert len(list((a / "reinject").glob("reinject_*.jsonl"))) == 1
    assert report.recovered == 5 and report.not_members == [str(y)]
    assert (
        f"into {a}" in report.text()
        and f"not members of the registry's roster (never written into): {y}" in report.text()
    )
    registry.commit_many(
        [(c["click_id"], token("dc1#eA", c["query_id"]), c["ts"]) for c in clicks[5:]]
    )
    for order in ([y, a], [a, y]):
        assert verify_runs(order, registry, dry_run=True).reinjected_into == {str(a): 5}


def test_where_more_than_one_directory_could_take_the_reinjections_verification_asks(
    tmp_path, sample, registry
):
    # a dead epoch's clicks (dc1 restarted from a deleted checkpoint) and both pipelines stopped:
    # dc1's new epoch and dc2 could each take them; which one must not depend on the argument order
    from millwheel.once import join_roster
    from millwheel.runtime._fs import Location
    from millwheel.runtime._runtime import where_of
    from topologies.photon.verify import AmbiguousTargetError
    from topologies.photon.verify_runs import verify_runs

    runs = {name: tmp_path / name for name in ("dc1", "dc2")}
    for name, epoch in (("dc1", "new"), ("dc2", "e2")):
        _leftover_of_a_refused_start(runs[name], sample, name, epoch)
    where1 = where_of(Location.of(str(runs["dc1"])))
    join_roster(registry, "dc1", "old", where1)  # the epoch that lost its checkpoint
    join_roster(registry, "dc1", "new", where1)
    join_roster(registry, "dc2", "e2", where_of(Location.of(str(runs["dc2"]))))
    clicks = _clicks(sample)[:4]
    registry.commit_many(
        [(c["click_id"], token("dc1#old", c["query_id"]), c["ts"]) for c in clicks]
    )
    with pytest.raises(
        AmbiguousTargetError,
        match=rf"(?s)4 clicks .* could go to any of {runs['dc1']} \(dc1\), {runs['dc2']} \(dc2\).*--target",
    ):
        verify_runs(list(runs.values()), registry)
    assert [r.token for r in registry.lookup_many([c["click_id"] for c in clicks])] == [
        token("dc1#old", c["query_id"]) for c in clicks
    ]  # unchanged
    report = verify_runs(list(runs.values()), registry, target=runs["dc2"])
    assert report.reinjected_into == {str(runs["dc2"]): 4}


# ---- the invariant of verification's writes, over random pipelines, rosters and registries ----
_NAMES = ("dc1", "dc2", "dc3")


@st.composite
def _scenarios(draw):
    """Given pipelines (members of the roster, or directories whose start was refused), running or
    not, with what each decided; a roster that may hold epochs nobody gave; clicks held by any of
    them, tentatively or not, or by nobody."""
    n = draw(st.integers(1, 4))
    clicks = [{"click_id": f"c{i}", "query_id": f"q{i}", "ts": 1_000 + i} for i in range(6)]
    ids = [c["click_id"] for c in clicks]
    given = []
    for i in range(n):
        name = draw(st.sampled_from(_NAMES))
        member = draw(st.booleans())
        where = f"h:/runs/{name}" if member else f"h:/runs/{name}-refused-{i}"
        given.append(
            {
                "name": name,
                "epoch": f"e{i}",
                "where": where,
                "member": member,
                "running": draw(st.booleans()),
                "joined": set(draw(st.lists(st.sampled_from(ids), max_size=3))),
                "gave_up": set(draw(st.lists(st.sampled_from(ids), max_size=3))),
                "offered": set(draw(st.lists(st.sampled_from(ids), max_size=2))),
                "queries": {f"q{cid[1:]}" for cid in draw(st.lists(st.sampled_from(ids)))},
            }
        )
    # epochs the roster knows and nobody gave: a dead epoch of a given directory, or another pipeline
    others = [
        {"name": draw(st.sampled_from(_NAMES)), "epoch": f"x{i}"}
        for i in range(draw(st.integers(0, 2)))
    ]
    holders = [f"{g['name']}#{g['epoch']}" for g in given] + [
        f"{o['name']}#{o['epoch']}" for o in others
    ]
    held = {
        cid: (draw(st.sampled_from(holders)), draw(st.booleans()))
        for cid in ids
        if draw(st.booleans())
    }
    return clicks, given, others, held


@settings(max_examples=80, deadline=None)
@given(_scenarios(), st.randoms(use_true_random=False))
def test_verification_writes_only_into_members_that_have_not_decided_the_click_whatever_the_order(
    scenario, rnd
):
    from id_registry import InProcessRegistryClient
    from millwheel.once import TENTATIVE, join_roster
    from topologies.photon.registry import OnceRegistryAdapter
    from topologies.photon.verify import AmbiguousTargetError

    clicks, given_, others, held = scenario
    # given up (held by a tentative token, in some given pipeline's give-ups) and joined nowhere;
    # of those, the ones whose holder is given and shows the give-up: offered to whoever may join them
    joined = set().union(*(g["joined"] for g in given_))
    open_ = {
        cid
        for cid, (_, tentative) in held.items()
        if tentative and any(cid in g["gave_up"] for g in given_) and cid not in joined
    }
    shown = {
        cid
        for cid in open_
        if any(f"{g['name']}#{g['epoch']}" == held[cid][0] and cid in g["gave_up"] for g in given_)
    }

    def run(order, *, dry_run):
        with InProcessRegistryClient() as client:
            reg = OnceRegistryAdapter(client)
            for g in given_:
                if g["member"]:
                    join_roster(reg, g["name"], g["epoch"], g["where"])
            for o in others:
                with contextlib.suppress(
                    Exception
                ):  # a name another directory holds: refused, as at a start
                    join_roster(reg, o["name"], o["epoch"], f"h:/runs/{o['name']}")
            members = {(m.id, m.where) for m in roster(reg)}
            reg.commit_many(
                [
                    (cid, token(h, f"q{cid[1:]}") + (TENTATIVE if tentative else ""), 1_000)
                    for cid, (h, tentative) in held.items()
                ]
            )
            into: dict[str, list[str]] = {}
            pipelines = [
                Pipeline(
                    g["name"],
                    set(g["joined"]),
                    running=g["running"],
                    gave_up=set(g["gave_up"]),
                    epoch=g["epoch"],
                    where=g["where"],
                    run=g["where"].split(":", 1)[1],
                    reinject=lambda cl, w=f"{g['name']}#{g['epoch']}": into.setdefault(
                        w, []
                    ).extend(c["click_id"] for c in cl),
                    offered=set(g["offered"]),
                    has_query=g["queries"].__contains__,
                )
                for g in (given_[i] for i in order)
            ]
            try:
                report = verify(clicks, pipelines, reg, dry_run=dry_run)
                # offers leave the registry as it is; a member is offered a click once
                assert all(
                    r.token == token(*held[cid][:1], f"q{cid[1:]}") + TENTATIVE
                    for cid, r in zip(sorted(open_), reg.lookup_many(sorted(open_)), strict=True)
                )
                if not dry_run:
                    assert verify(clicks, pipelines, reg).offered == 0
            except AmbiguousTargetError as exc:
                assert "--target" in str(exc)
                ids = [c["click_id"] for c in clicks]
                assert [r.status.value == "found" for r in reg.lookup_many(ids)] == [
                    cid in held for cid in ids
                ]  # nothing cleared
                return "ambiguous", {}, members
            return report, into, members

    order = list(range(len(given_)))
    report, into, members = run(order, dry_run=False)
    shuffled = order[:]
    rnd.shuffle(shuffled)
    again, _, _ = run(shuffled, dry_run=True)
    if report == "ambiguous":
        assert again == "ambiguous"  # asked in any order, never decided by it
        return
    assert (
        again != "ambiguous"
        and again.reinjected_into == report.reinjected_into
        and again.offered_into == report.offered_into
    )  # the same directories, in any order
    by_id = {f"{g['name']}#{g['epoch']}": g for g in given_}
    for ident, cids in into.items():
        g = by_id[ident]
        assert (
            ident,
            g["where"],
        ) in members  # a member of the roster, under its identity and place
        assert not set(cids) & (g["joined"] | g["gave_up"])  # never a click it decided already
        assert len(cids) == len(set(cids))
        # a given-up click is offered once, only where its query is
        assert not set(cids) & open_ & g["offered"]
        assert all(f"q{cid[1:]}" in g["queries"] for cid in set(cids) & open_)
    assert sum(len(c) for c in into.values()) == report.recovered + report.offered
    # ... and to every member that may join it
    for g in given_:
        if (f"{g['name']}#{g['epoch']}", g["where"]) in members:
            want = {
                cid
                for cid in shown
                if cid not in g["joined"] | g["gave_up"] | g["offered"]
                and f"q{cid[1:]}" in g["queries"]
            }
            assert want <= set(into.get(f"{g['name']}#{g['epoch']}", [])), (g, want)
    running = {f"{g['name']}#{g['epoch']}" for g in given_ if g["running"]}
    assert not {
        cid
        for cids in into.values()
        for cid in cids
        if held.get(cid, ("",))[0] in running and cid not in open_
    }  # in flight: left alone (a give-up its holder shows is decided, and may be offered)
