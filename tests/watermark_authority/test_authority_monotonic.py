"""Published watermarks never go back: not after late, out-of-order or stale reports (§7.2).

A hypothesis test drives the core with random operations and checks it against a
reference model of the interval map, in which every accepted write publishes the raw
minimum if it rose; a fixed shuffled stream checks the same over HTTP.
"""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from watermark_authority import MIN_TIMESTAMP, Authority, MemoryJournal, StaleTokenError

INTERVALS = ["a", "b", "c", "d"]

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("report"), st.sampled_from(INTERVALS), st.integers(0, 100), st.booleans()
        ),
        st.tuples(st.just("acquire"), st.sampled_from(INTERVALS)),
        st.tuples(st.just("read")),
        st.tuples(st.just("restart")),
    ),
    max_size=60,
)


@given(ops)
def test_the_published_watermark_follows_the_model_and_never_goes_back(operations):
    journal = MemoryJournal()
    a = Authority(journal, clock=lambda: 0)
    tokens = a.acquire("c", INTERVALS)
    old_tokens: dict[str, int] = {}
    model = dict.fromkeys(INTERVALS, MIN_TIMESTAMP)  # last value per interval
    published = MIN_TIMESTAMP
    for op in operations:
        if op[0] == "report":
            _, iv, value, stale = op
            if stale and iv in old_tokens:
                try:
                    a.report("c", [(iv, old_tokens[iv], value, None)])
                except StaleTokenError:
                    pass
                else:
                    msg = "a stale token was accepted"
                    raise AssertionError(msg)
            else:
                a.report("c", [(iv, tokens[iv], value, None)])
                model[iv] = value
                published = max(
                    published, min(model.values())
                )  # each write publishes a raw value that rose
        elif op[0] == "acquire":
            old_tokens[op[1]] = tokens[op[1]]
            tokens[op[1]] = a.acquire("c", [op[1]])[op[1]]
        elif op[0] == "restart":
            a = Authority(journal, clock=lambda: 0)
        else:
            assert a.watermark("c") == published
            assert a.published()["c"] == published
    assert a.watermark("c") == published


def test_a_value_is_published_by_the_write_that_reached_it_even_if_nobody_read_it():
    """Publishing happens after each write, before any read: a read is a pure snapshot read."""
    journal = MemoryJournal()
    a = Authority(journal, clock=lambda: 0)
    t = a.acquire("c", ["a", "b"])
    a.report("c", [("a", t["a"], 50, None), ("b", t["b"], 60, None)])  # raw 50: published now
    a.report("c", [("a", t["a"], 10, None)])  # a late report: raw 10, nobody read 50 in between
    assert a.watermark("c") == 50
    assert Authority(journal).watermark("c") == 50  # and it was journaled before it could be read


def test_out_of_order_reports_never_move_a_watermark_back(client, ns):
    c = f"{ns}c"
    rng = random.Random(7)
    t = client.acquire_many(c, ["a", "b"])
    # each interval's reports, sent in a shuffled order: late ones carry older values
    reports = [(iv, ts) for iv in ("a", "b") for ts in range(1_000, 21_000, 1_000)]
    rng.shuffle(reports)
    seen = []
    for iv, ts in reports:
        client.report(c, iv, t[iv], ts)
        seen.append(client.watermark(c))
    assert seen == sorted(seen), "a published watermark went back"
    client.report(c, "a", t["a"], 500)  # a very late report: the published value stays
    assert client.watermark(c) == seen[-1]
    assert client.percentile_watermark(c, 99) >= seen[-1]


def test_percentile_watermarks_never_go_back_either(client, ns):
    c = f"{ns}c"
    t = client.acquire_many(c, [f"i{k}" for k in range(10)])
    client.report_batch(c, [(f"i{k}", t[f"i{k}"], 1_000 * (k + 1)) for k in range(10)])
    p50 = client.percentile_watermark(c, 50)
    assert p50 == 6_000
    client.report_batch(c, [(f"i{k}", t[f"i{k}"], 0) for k in range(5, 10)])  # late reports
    assert client.percentile_watermark(c, 50) == 6_000
    assert client.watermark(c) == 1_000
