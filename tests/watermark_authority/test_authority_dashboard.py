"""The dashboard renders live data in real headless Chromium (MillWheel Fig. 15-style lag charts).

The page writes what it plotted (``#plotted``: per chart the lag series, what was handed to
uPlot, what uPlot holds and where it put each line) and, from uPlot's own draw hook, what each
chart drew (``#drawn``: per series the points inside the axis, and the pixels of its colour
on the canvas) into the DOM; the test reads them back with ``chromium --dump-dom``. The
checks are on the data; one check of pixels proves the chart is painted at all.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from id_registry import embedded_registry
from id_registry.client import dashboard_link
from watermark_authority import embedded_authority
from watermark_authority._server import STATIC_DIR

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="Debian's chromium is not installed (bash scripts/setup.sh --test installs it)",
    ),
]


def render(url: str, profile: str, *, budget_ms: int = 3_000) -> str:
    """Load ``url`` in headless Chromium, let it run ``budget_ms`` of virtual time, return the DOM."""
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={budget_ms}",
        "--window-size=1200,1400",
        "--dump-dom",
        url,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def embedded_json(dom: str, element_id: str) -> dict:
    m = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', dom, re.S)
    assert m, f"no #{element_id} in the page"
    return json.loads(html.unescape(m.group(1)))


def row(dom: str, table: str, name: str) -> str:
    body = re.search(rf'<table id="{table}">.*?</table>', dom, re.S).group(0)
    m = re.search(rf'<tr data-name="{re.escape(name)}"[^>]*>.*?</tr>', body, re.S)
    assert m, f"no row for {name} in #{table}"
    return m.group(0)


def connection(dom: str, element_id: str) -> tuple[str, str, str]:
    """An indicator's class, ``data-status`` and text."""
    m = re.search(
        rf'<span id="{element_id}" class="(\w*)" data-status="(\d*)">(.*?)</span>', dom, re.S
    )
    assert m, re.search(rf'<span id="{element_id}".*?</span>', dom, re.S)
    return m.group(1), m.group(2), html.unescape(m.group(3))


def wait_for_samples(wm, names: list[str], n: int = 3) -> None:
    deadline = time.monotonic() + 10
    while (
        sum(
            all(x in s["w"] for x in names)
            for s in wm._call("GET", "/v1/history", params={"seconds": "60"})["samples"]
        )
        < n
    ):
        assert time.monotonic() < deadline, "the authority is not sampling"
        time.sleep(0.1)


@pytest.mark.timeout(180)
def test_the_dashboard_plots_wall_and_event_time_lag_and_shows_what_is_stuck(tmp_path):
    with embedded_authority(str(tmp_path / "wa"), extra_args=["--sample-interval", "0.2"]) as svc:
        wm, worker = svc.client(owner="driver-1:100"), svc.client(owner="worker-9:77")
        now = int(time.time() * 1000)
        low = {
            "WindowCounter": now - 5_000,
            "SpikeDetector": now - 1_000,
            "DipDetector": now - 120_000,
        }
        t = wm.acquire_many("WindowCounter", ["a-m", "n-z"])
        wm.report_batch(
            "WindowCounter",
            [("a-m", t["a-m"], low["WindowCounter"], 3), ("n-z", t["n-z"], now - 2_000, 40)],
        )
        wm.report("SpikeDetector", "all", wm.acquire("SpikeDetector", "all"), low["SpikeDetector"])
        wm.report(
            "DipDetector", "all", wm.acquire("DipDetector", "all"), low["DipDetector"]
        )  # a 120 s outlier
        s = worker.acquire_many("Stuck", ["interval-0", "interval-1"])
        worker.report(
            "Stuck", "interval-0", s["interval-0"], now - 1_000
        )  # interval-1 never reports: nothing known
        wm.expect_injector_processes("queries", ["reader-0", "reader-1"])
        wm.report_injector("queries", "reader-0", now - 1_000)  # reader-1 has not reported: MIN
        computations = ["DipDetector", "SpikeDetector", "Stuck", "WindowCounter"]
        wait_for_samples(wm, [*computations, "queries"])

        dom = render(svc.url + "/", str(tmp_path / "profile"))
        assert re.search(r'<body[^>]*data-rendered="1"', dom), "the page never rendered a chart"
        assert int(re.search(r'data-refreshes="(\d+)"', dom).group(1)) >= 2, (
            "the page did not refresh itself"
        )
        assert re.search(r'<span id="connection" class="ok" data-status="200">live</span>', dom)

        plotted = embedded_json(dom, "plotted")
        wall = plotted["wall"]
        assert plotted["names"] == [*computations, "queries"] and plotted["injectors"] == [
            "queries"
        ]
        assert wall["canvas"] is True and wall["plot"]["distr"] == 3  # a log axis
        assert wall["plot"]["series"] == [*computations, "queries (injector)"]
        assert wall["plot"]["points"] == wall["samples"] >= 3
        for name, lw in low.items():  # every plotted lag is exactly (sample time - low watermark)
            points = [
                (x, lag)
                for x, lag in zip(wall["x"], wall["series"][name], strict=True)
                if lag is not None
            ]
            # a sample taken between the acquisition and the first report knows nothing yet
            while points and points[0][1] == "stuck":
                points.pop(0)
            assert len(points) >= 3, name
            for x, lag in points:
                assert lag == pytest.approx(x - lw / 1000, abs=1e-3), (name, x, lag)
        assert 5 <= wall["last"]["WindowCounter"] < 5 + 120
        assert 120 <= wall["last"]["DipDetector"] < 120 + 120

        # stuck at MIN ("nothing known", the worst state): drawn, pinned above every real lag
        assert wall["stuck"] == ["Stuck", "queries"]
        assert (
            set(wall["series"]["Stuck"]) - {None} == {"stuck"} and wall["last"]["Stuck"] == "stuck"
        )  # None: before it existed
        assert wall["ceiling"] >= 3 * wall["last"]["DipDetector"]
        assert (
            set(wall["drawn"]["Stuck"]) - {None} == {wall["levels"]["Stuck"]}
            and wall["levels"]["Stuck"] >= wall["ceiling"]
        )
        assert (
            wall["levels"]["queries"] > wall["levels"]["Stuck"]
        )  # stacked, not hidden behind each other
        assert wall["plot"]["y"][1] > wall["levels"]["queries"]  # inside the axis
        pos = wall["positions"]
        assert (
            pos["queries"]
            < pos["Stuck"]
            < pos["DipDetector"]
            < pos["WindowCounter"]
            < pos["SpikeDetector"]
        )  # y grows downwards
        # the 120 s outlier does not flatten the others against the axis: a linear axis up to 120 s puts
        # a lag of a few seconds within ~12 px of zero; the log axis puts it far above its floor (0.1 s)
        for name in ("SpikeDetector", "WindowCounter"):
            assert wall["plot"]["floor_position"] - pos[name] >= 40, (name, pos, wall["plot"])

        drawn = embedded_json(dom, "drawn")  # recorded by uPlot's draw hook: the data just drawn
        for name in ("DipDetector", "SpikeDetector", "WindowCounter", "Stuck"):
            inside = sum(v is not None for v in wall["drawn"][name])
            assert drawn["wall"]["points"][name] == inside >= 3, (
                f"{name} not drawn on the wall-time chart: {drawn}"
            )
        assert sum(drawn["wall"]["pixels"].values()) > 200, (
            f"the wall-time chart is not painted: {drawn}"
        )  # the page renders
        # no injector watermark is known yet (reader-1 is missing): no lag behind the inputs, except "stuck"
        event = plotted["event"]
        assert event["names"] == computations and event["stuck"] == ["Stuck"]
        for n in ("DipDetector", "SpikeDetector", "WindowCounter"):
            series = list(event["series"][n])
            while series and series[0] is None:  # before it existed
                series.pop(0)
            # a sample taken between the acquisition and the first report knows nothing yet
            while series and series[0] == "stuck":
                series.pop(0)
            assert all(v is None for v in series), (n, event["series"][n])
        assert (
            drawn["event"]["points"]["Stuck"] > 0 and drawn["event"]["points"]["WindowCounter"] == 0
        )

        wc = row(dom, "computations", "WindowCounter")
        assert f'data-low-watermark="{low["WindowCounter"]}"' in wc
        assert (
            'data-interval="a-m"' in wc and 'data-owner="driver-1:100"' in wc
        )  # a-m holds it back; its owner
        assert "inputs: nothing known" in wc
        stuck = row(dom, "computations", "Stuck")
        assert re.match(
            r'<tr data-name="Stuck" data-low-watermark="-9\d+" class="stuck">', stuck
        ), stuck[:200]  # MIN, as a double
        assert "MIN — nothing known" in stuck and "stuck: nothing known" in stuck
        assert (
            'data-interval="interval-1"' in stuck
            and "interval-1 (never reported)" in stuck
            and 'data-owner="worker-9:77"' in stuck
        )
        q = row(dom, "injectors", "queries")
        assert 'class="stuck"' in q and "MIN — nothing known" in q
        assert 'data-process="reader-1"' in q and "missing (never reported)" in q

        # the inputs become known: lag behind them = min injector watermark - computation watermark
        wm.report_injector("queries", "reader-1", now - 1_500)
        time.sleep(0.5)
        wait_for_samples(wm, [*computations, "queries"])
        dom = render(svc.url + "/", str(tmp_path / "profile2"))
        plotted, drawn = embedded_json(dom, "plotted"), embedded_json(dom, "drawn")
        event = plotted["event"]
        assert event["last"]["WindowCounter"] == pytest.approx(
            3.5, abs=1e-3
        )  # (now - 1.5 s) - (now - 5 s)
        assert event["last"]["DipDetector"] == pytest.approx(118.5, abs=1e-3)
        assert event["last"]["SpikeDetector"] == pytest.approx(
            -0.5, abs=1e-3
        )  # (now - 1.5 s) - (now - 1 s): ahead of these inputs, drawn at the floor
        assert event["drawn"]["SpikeDetector"][-1] == event["floor"]
        assert event["stuck"] == ["Stuck"] and plotted["wall"]["stuck"] == ["Stuck"]
        assert (
            drawn["event"]["points"]["WindowCounter"] > 0
            and drawn["event"]["points"]["DipDetector"] > 0
        )
        assert ">3.5 s<" in row(dom, "computations", "WindowCounter")
        assert 'data-process="reader-1"' in row(
            dom, "injectors", "queries"
        )  # now it is the one holding
        assert 'class="stuck"' not in row(dom, "injectors", "queries")


class _FailingStatus(SimpleHTTPRequestHandler):
    """The dashboard's files, and a /v1/status that answers 401 (e.g. a proxy in front that wants a login)."""

    def do_GET(self) -> None:  # noqa: N802 - the http.server hook
        if self.path.startswith("/v1/status"):
            self._json(401, {"error": "unauthorized", "message": "GET /v1/status needs the secret"})
        elif self.path.startswith("/v1/history"):
            self._json(200, {"now": 0, "interval": 1.0, "samples": []})
        else:
            self.path = (
                self.path.removeprefix("/static")
                if self.path.startswith("/static/")
                else "/dashboard.html"
            )
            super().do_GET()

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        return


@pytest.mark.timeout(60)
def test_an_http_error_is_shown_with_its_status_not_as_unreachable(tmp_path):
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(_FailingStatus, directory=str(STATIC_DIR))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        dom = render(
            f"http://127.0.0.1:{server.server_address[1]}/",
            str(tmp_path / "profile"),
            budget_ms=1_500,
        )
    finally:
        server.shutdown()
        server.server_close()
    m = re.search(r'<span id="connection" class="bad" data-status="401">(.*?)</span>', dom)
    assert m, re.search(r'<span id="connection".*?</span>', dom).group(0)
    assert m.group(1).startswith("HTTP 401: secret required — GET /v1/status needs the secret")
    assert "unreachable" not in m.group(1)
    assert re.search(r'<body[^>]*data-rendered="0"', dom)


def registry_traffic(client, seconds: float) -> None:
    """Two pipelines' worth of commits for ``seconds``, from 3 threads (some requests share a
    durable write, Photon §2.2.1): new ids, a replay of some (COMMITTED again), the other pipeline's
    commits of some (CONFLICT), and events behind the GC boundary (TOO_OLD)."""
    now = int(time.time() * 1000)
    client.advance_gc(now - 60_000)

    def pipeline(n: int) -> None:
        i = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            batch = [(f"p{n}-{i}-{k}", "dc1", now) for k in range(200)]
            client.commit_many(batch)
            client.commit_many(batch[:20])  # a replayed micro-batch: same token
            client.commit_many(
                [(click, "dc2", t) for click, _, t in batch[:5]]
            )  # joined elsewhere already
            client.commit_many([(f"p{n}-{i}-old", "dc1", now - 120_000)])  # before the GC boundary
            i += 1
            time.sleep(0.05)

    workers = [threading.Thread(target=pipeline, args=(n,)) for n in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    time.sleep(1.05 - time.time() % 1)  # its last second is over: the registry's figures are final


@pytest.mark.timeout(180)
def test_the_registry_panel_plots_a_live_registrys_commits_conflicts_and_batches(tmp_path):
    with (
        embedded_authority(str(tmp_path / "wa")) as svc,
        embedded_registry(str(tmp_path / "reg")) as reg,
    ):
        registry_traffic(reg.client(), 2.5)
        expected = reg.client().stats(300)
        h = expected["history"]
        link = (
            dashboard_link(svc.url, reg.url, reg.secret) + "&metrics=http://127.0.0.1:9/metrics"
        )  # both sources
        assert reg.secret.reveal() not in link

        dom = render(link, str(tmp_path / "profile"))
        assert connection(dom, "registry-connection") == ("ok", "200", "live")
        assert connection(dom, "connection")[:2] == (
            "ok",
            "200",
        )  # the authority's own part is unaffected
        assert 'id="metrics-link" href="http://127.0.0.1:9/metrics"' in dom
        assert re.search(r'<section id="registry">', dom), "the panel stayed hidden"
        assert int(re.search(r'data-registry-refreshes="(\d+)"', dom).group(1)) >= 2, (
            "the panel did not refresh itself"
        )

        plotted = embedded_json(dom, "registry-plotted")
        assert plotted["url"] == reg.url and plotted["seconds"] == 300
        sums = plotted["sums"]
        # the page shows the registry's own figures, second by second
        assert sums == {
            name: sum(h[name])
            for name in ("commits", "conflicts", "too_old", "requests", "groups", "group_items")
        }
        assert (
            sums["commits"] > sums["conflicts"] > 0 and sums["too_old"] > 0 and sums["groups"] > 0
        )
        assert plotted["group_max"] == max(h["group_max"]) >= 200
        totals = {k: v for k, v in plotted["totals"].items() if k != "commits_per_s"}
        assert totals == {k: v for k, v in expected["totals"].items() if k != "commits_per_s"}
        assert (
            totals["committed"] + totals["repeated"] == sums["commits"]
            and totals["conflicts"] == sums["conflicts"]
        )
        series = plotted["series"]
        seconds = {t / 1000: i for i, t in enumerate(h["t"])}
        for i, x in enumerate(
            plotted["x"]
        ):  # the same seconds on the x axis (the page asked later: shifted)
            j = seconds.get(x)
            if j is not None:
                assert (series["commits"][i], series["conflicts"][i], series["too_old"][i]) == (
                    h["commits"][j],
                    h["conflicts"][j],
                    h["too_old"][j],
                )
                if h["groups"][j]:
                    assert series["ids_mean"][i] == pytest.approx(
                        h["group_items"][j] / h["groups"][j]
                    )
                    assert series["ids_max"][i] == h["group_max"][j] and series[
                        "requests_per_write"
                    ][i] == pytest.approx(h["requests"][j] / h["groups"][j])
                else:
                    assert series["ids_mean"][i] is None and series["ids_max"][i] is None
        rates, batches = plotted["rates"], plotted["batches"]
        assert (
            rates["canvas"]
            and rates["plot"]["series"] == ["commits/s", "conflicts/s", "too old/s"]
            and rates["plot"]["points"] == 300
        )
        assert (
            rates["plot"]["scales"]["n"][2] == 4
        )  # one asinh axis: thousands of commits and a few conflicts both show, 0 at 0
        assert batches["canvas"] and batches["plot"]["series"] == [
            "ids per write (mean)",
            "ids per write (max)",
            "requests per write (mean)",
        ]
        assert (
            batches["plot"]["scales"]["ids"][2] == 3
            and batches["plot"]["scales"]["ids"][1] >= plotted["group_max"]
        )  # a log axis that holds them

        drawn = embedded_json(
            dom, "registry-drawn"
        )  # recorded by uPlot's draw hook: the data just drawn
        for chart, names in (
            ("rates", ("commits", "conflicts", "too_old")),
            ("batches", ("ids_mean", "ids_max", "requests_per_write")),
        ):
            for name in names:
                inside = sum(v is not None for v in series[name])
                assert drawn[chart]["points"][name] == inside > 0, (
                    f"{name} not drawn on the {chart} chart: {drawn}"
                )

        totals_row = re.search(r'<table id="registry-totals">.*?</table>', dom, re.S).group(0)
        for cls, value in (
            ("committed", totals["committed"]),
            ("conflicts", totals["conflicts"]),
            ("too-old", totals["too_old"]),
            ("groups", totals["groups"]),
        ):
            assert f'class="{cls}" data-value="{value}"' in totals_row, (cls, value)


@pytest.mark.timeout(180)
def test_the_registry_panel_says_when_the_key_is_wrong_or_the_registry_is_unreachable(tmp_path):
    with (
        embedded_authority(str(tmp_path / "wa")) as svc,
        embedded_registry(str(tmp_path / "reg")) as reg,
    ):
        dom = render(
            f"{svc.url}/#registry={reg.url}&registry_key={'x' * 43}",
            str(tmp_path / "p1"),
            budget_ms=1_500,
        )
        cls, status, text = connection(dom, "registry-connection")
        assert (cls, status) == ("bad", "401"), text
        assert (
            text.startswith("HTTP 401: the registry's read key is missing or wrong")
            and "not the id registry's secret or its read key" in text
        )
        assert "unreachable" not in text and connection(dom, "connection")[:2] == ("ok", "200")

        dom = render(
            f"{svc.url}/#registry={reg.url}", str(tmp_path / "p2"), budget_ms=1_500
        )  # no key at all
        assert connection(dom, "registry-connection")[:2] == ("bad", "401")
        gone = reg.url
    with embedded_authority(str(tmp_path / "wa2")) as svc:
        dom = render(
            f"{svc.url}/#registry={gone}&registry_key={'k' * 43}",
            str(tmp_path / "p3"),
            budget_ms=1_500,
        )
        cls, status, text = connection(dom, "registry-connection")
        assert (cls, status) == ("bad", "0") and text.startswith("registry unreachable"), text
        assert connection(dom, "connection")[:2] == ("ok", "200")
        assert re.search(r"<body[^>]*data-registry-refreshes", dom) is None
