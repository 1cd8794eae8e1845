"""The input every plan's query starts from (``docs/runtime.md``, "The mapping", "Plans").

::

    heartbeats/<C>/*.parquet ─────────────────────────────┐  (input low watermark, ticks)
    streams/<S>/<producer>/*.parquet ─► key (JVM [+ UDF]) ┤  (one per input stream, §4.2: the
                                                          ▼   producer's key columns; the rest keyed
                                                              by a UDF, or by the step: see keyed_by_producer)
        union ─► withWatermark("wm_ts", "0 seconds")  ─► the plan (``Plan.build``)

An input its producer keyed reaches a plan that takes markers (``Plan.takes_markers``) as
one marker row per Spark group and task, its records read by the step from the batch's
files (``_scan.py``); unless the query has the keying stage or the consumer carries
declared fields, which need the rows. A plan whose tasks find the marked intervals
themselves (``Plan.marks_in_tasks``: the Arrow plan) gets no marker rows, and Spark reads
no column of those inputs.
"""

from __future__ import annotations

from functools import reduce
from typing import Any

from millwheel.runtime._fieldcols import (
    carry_columns,
    input_schema,
    keying_fields,
    needed_fields,
    reads_values,
)
from millwheel.runtime._ownkeying import KEYING_RESULT, make_keying
from millwheel.runtime._scan import (
    MARKER_SCHEMA,
    SCAN_COLUMN,
    SCAN_ONLY_COLUMNS,
    BatchScan,
    Markers,
    ScannedInput,
)
from millwheel.runtime._spark_internals import sources_asked_in_plan_order
from millwheel.runtime._wire import HEARTBEAT_SCHEMA, LOG_SCHEMA, RowKind
from millwheel.runtime.plans._base import Plan, QueryInputs

__all__ = ["heartbeats_listed_first", "query_inputs"]


def heartbeats_listed_first(sources: int, max_files_per_trigger: int | None) -> bool:
    """Whether a query of ``sources`` file sources, its heartbeats first in the plan, lists
    the heartbeats before every input when Spark plans a batch
    (:func:`~millwheel.runtime._spark_internals.sources_asked_in_plan_order`), and each
    input takes every file its listing finds (no ``maxFilesPerTrigger``). Then a batch that
    reads a heartbeat file reads, or follows a batch that read, every input file published
    before the heartbeat was written (``_consumed.input_watermarks``; ``docs/runtime.md``,
    "Low watermarks and timers").

    >>> heartbeats_listed_first(3, None), heartbeats_listed_first(5, None), heartbeats_listed_first(2, 10)
    (True, False, False)
    """
    return sources_asked_in_plan_order(sources) and not max_files_per_trigger


def query_inputs(query: Any, plan: Plan) -> QueryInputs:
    """The union of ``query``'s heartbeats and inputs for ``plan``, with its event-time watermark."""
    from pyspark.sql import functions as F

    rt, spec, name = query.rt, query.spec, query.name
    spark, settings = rt.spark, rt.settings
    # heartbeats, ticks, and a rescale's rows (``_rescale.py``), which name their Spark
    # group themselves (``_group``); a tick for an interval this layout does not have
    # (written before a rescale) wakes nothing: every interval is ticked at start anyway
    hb = (
        spark.readStream.schema(HEARTBEAT_SCHEMA)
        .option("maxFileAge", "36500d")
        .parquet(query.heartbeats.uri)
        .where(F.col("group").isNotNull() | (F.col("interval") < F.lit(query.intervals)))
        .select(
            F.col("interval"),
            F.col("kind"),
            F.col("key"),
            F.lit(None).cast("string").alias("id"),
            F.lit(0).cast("long").alias("ts"),
            F.col("value"),
            # a heartbeat row addressed to a key interval (``_query.ComputationQuery._addressed``):
            # the watermark applies in the batch that reads it; on a record, ``wm`` is its sender's
            F.col("wm"),
            F.lit(None).cast("string").alias("stream"),
            F.lit(None).cast("string").alias("src"),
            F.lit(None).cast("long").alias("row"),
            F.col("now"),
            F.timestamp_millis("wm").alias("wm_ts"),
            F.col("group").alias("_group"),
            F.col("upto"),
        )
    )
    kcol, icol = rt.keyer.columns(name)
    records, markers, scanned = [], [], []
    for stream, extractor in spec.inputs.items():
        readers, plain, schema = (
            [],
            [],
            input_schema(f"{LOG_SCHEMA}, {rt.keyer.ddl([name])}", rt.keyer, stream),
        )
        for producer in rt.producers(stream):
            r = spark.readStream.schema(schema).option("maxFileAge", "36500d")
            if settings.max_files_per_trigger:
                r = r.option("maxFilesPerTrigger", settings.max_files_per_trigger)
            source = r.parquet(rt.streams.location(stream, producer).uri)
            plain.append(source)
            # the file and row a record came from: rows are put back in send order (file
            # names sort in publication order) so a key's records are stepped as sent; per
            # reader: a union does not pass its children's ``_metadata`` columns up
            readers.append(
                source.withColumn("src", F.col("_metadata.file_name")).withColumn(
                    "row", F.col("_metadata.row_index")
                )
            )
        # a stream's readers share one schema; the plan takes one of the two unions (each
        # file source once in the plan: one offset-log entry per input directory)
        raw = reduce(lambda a, b: a.unionByName(b), readers)
        bare = reduce(lambda a, b: a.unionByName(b), plain)
        if (
            plan.takes_markers
            and not query.keying_stage
            and not needed_fields(spec, rt.keyer, stream)
        ):
            # the step reads this input's records from the batch's files (``_scan.py``);
            # only the interval of each row is read here, as ``keyed_by_producer`` gives it.
            # A plan whose tasks find their intervals in those files themselves
            # (``Plan.marks_in_tasks``) keeps the file source in its place in the plan, for
            # the offsets that name the batch's files, and reads none of it: a scan of no
            # columns under a filter that is always false (footers only, no rows)
            markers.append(
                bare.where(F.lit(False)).select(F.lit(None).cast("int").alias("interval"))
                if plan.marks_in_tasks
                else raw.select(
                    F.coalesce(
                        F.col(f"`{icol}`"),
                        F.pmod(F.xxhash64(F.col("id")), F.lit(query.intervals)).cast("int"),
                    ).alias("interval")
                )
            )
            scanned += [
                ScannedInput(stream, p, rt.streams.location(stream, p).uri)
                for p in rt.producers(stream)
            ]
            continue
        records.append(
            keyed(query, raw, stream, extractor)
            if query.keying_stage
            else keyed_by_producer(query, raw, stream)
        )
    as_rows = bool(records)  # an input whose records Spark reads as rows
    # the Spark group of each key interval (``_runtime.pin_groups``, ``_layout.py``): heartbeats keep -1;
    # the worker takes the interval from the group, so the column stops here: one
    # column less through the shuffle and the Arrow/pandas round trip
    groups = F.array(*(F.lit(g) for g in query.groups))
    group = F.when(F.col("interval") < 0, F.col("interval")).otherwise(
        F.element_at(groups, F.col("interval") + 1)
    )
    hb = hb.withColumn("group", F.coalesce(F.col("_group"), group)).drop("interval", "_group")
    records = [part.withColumn("group", group).drop("interval") for part in records]
    scan_only = bool(markers) and not records and plan.narrows_to_markers
    if markers:
        marked = reduce(lambda a, b: a.unionByName(b), markers).select(group.alias("group"))
        records.append(
            marked.select("group", F.lit(True).alias(SCAN_COLUMN))  # no rows
            if plan.marks_in_tasks
            else marked.mapInArrow(Markers(), MARKER_SCHEMA)
        )
    # ``mw_fields_<i>``: one per input; heartbeats first: Spark asks sources for offsets in
    # this order (up to four: ``heartbeats_listed_first``)
    union = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), [hb, *records])
    if scan_only:
        # the step reads every record from the batch's files: its frames hold markers,
        # heartbeats, ticks and a rescale's rows, which need none of a record's columns;
        # PySpark converts each column of each group's frame to pandas (~4% of the step)
        union = union.select(*SCAN_ONLY_COLUMNS)
    # a computation that reads no values (its ``record_columns``) gets them only if it asks (``FileValues``)
    scan = (
        BatchScan(
            query.checkpoint.uri, tuple(scanned), kcol, icol, query.intervals, reads_values(spec)
        )
        if scanned
        else None
    )
    sources = 1 + sum(len(rt.producers(stream)) for stream in spec.inputs)
    return QueryInputs(
        union.withWatermark("wm_ts", "0 seconds"),
        scan,
        tuple(scanned),
        heartbeats_listed_first(sources, settings.max_files_per_trigger),
        as_rows,
    )


def keyed_by_producer(query: Any, raw: Any, stream: str) -> Any:
    """Rows of one input as :data:`KEYED_SCHEMA`, without the keying stage: what the
    query reads when every input file carries this computation's key columns.

    Key and interval are the producer's ``key:C`` / ``interval:C``. A row without them
    (its extractor failed at the producer; or a file without them that appeared after
    the query started) goes to an interval chosen by a hash of its id, as
    :attr:`RowKind.UNKEYED` with its own key, and the step there keys it
    (``IntervalBatch._key_here``): a dead letter is emitted from there; a record whose
    key is in another interval fails the batch, and ``ComputationQuery.check`` restarts
    the query with the keying stage.
    """
    from pyspark.sql import functions as F

    kcol, icol = query.rt.keyer.columns(query.name)
    unkeyed = F.col(f"`{icol}`").isNull()
    return raw.select(
        F.when(unkeyed, F.pmod(F.xxhash64(F.col("id")), F.lit(query.intervals)).cast("int"))
        .otherwise(F.col(f"`{icol}`"))
        .alias("interval"),
        F.when(unkeyed, F.lit(int(RowKind.UNKEYED)))
        .otherwise(F.lit(int(RowKind.RECORD)))
        .alias("kind"),
        F.when(unkeyed, F.col("key")).otherwise(F.col(f"`{kcol}`")).alias("key"),
        F.col("id"),
        F.col("ts"),
        F.col("value"),
        F.col("wm"),
        F.lit(stream).alias("stream"),
        F.col("src"),
        F.col("row"),
        F.lit(None).cast("long").alias("now"),
        *carry_columns(query.spec, query.rt.keyer, stream),
    )


def keyed(query: Any, raw: Any, stream: str, extractor: Any) -> Any:
    """Rows of one input keyed for this computation (§4.2), as :data:`KEYED_SCHEMA`.

    Key and interval come from the producer's ``key:C`` / ``interval:C`` columns
    (``_keying.py``), taken in the JVM. The consumer's own keying
    (:func:`~millwheel.runtime._ownkeying.make_keying`, an Arrow UDF) gets the id,
    timestamp, key and value only of rows without them, so a keyed row's value never
    travels to Python here. One plan node per input directory: a file source read
    twice would be two entries of the offset log (``docs/runtime.md``).
    """
    from pyspark.sql import functions as F

    spec = query.spec
    kcol, icol = query.rt.keyer.columns(query.name)
    # (PySpark's stubs type arrow_udf's overloads by its function type; the keying function is
    # an Arrow-batch function it infers from the hints)
    keying = F.arrow_udf(  # type: ignore[call-overload]
        make_keying(query.name, stream, extractor, query.intervals, spec.options.on_error),
        KEYING_RESULT,
    )
    need = F.col(f"`{icol}`").isNull()
    k = keying(
        need,
        *(F.when(need, F.col(c)) for c in ("id", "ts", "key", "value")),
        keying_fields(query.rt.keyer, stream, need),
    )
    return raw.withColumn("_k", k).select(
        F.coalesce(F.col(f"`{icol}`"), F.col("_k.interval")).alias("interval"),
        F.coalesce(F.col("_k.kind"), F.lit(int(RowKind.RECORD))).alias("kind"),
        F.coalesce(F.col(f"`{kcol}`"), F.col("_k.key")).alias("key"),
        F.coalesce(F.col("_k.id"), F.col("id")).alias("id"),
        F.coalesce(F.col("_k.ts"), F.col("ts")).alias("ts"),
        F.coalesce(F.col("_k.value"), F.col("value")).alias("value"),
        F.col("wm"),
        F.lit(stream).alias("stream"),
        F.col("src"),
        F.col("row"),
        F.lit(None).cast("long").alias("now"),
        *carry_columns(spec, query.rt.keyer, stream),
    )
