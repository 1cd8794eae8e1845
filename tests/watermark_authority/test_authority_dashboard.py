"""The dashboard renders live data in real headless Chromium (MillWheel Fig. 15-style lag chart).

The page writes what it plotted (``#plotted``: the lag series handed to uPlot and what
uPlot holds) and how many pixels of each series' colour ended up on the chart's canvas
(``#drawn``) into the DOM; the test reads them back with ``chromium --dump-dom``.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import time

import pytest

from watermark_authority import MIN_TIMESTAMP, embedded_authority

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (bash scripts/setup.sh --test installs it)"),
]


def render(url: str, profile: str, *, budget_ms: int = 3_000, screenshot: str | None = None) -> str:
    """Load ``url`` in headless Chromium, let it run ``budget_ms`` of virtual time, return the DOM."""
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}",
        "--window-size=1200,1000",
    ]  # fmt: skip
    cmd += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=90)
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


@pytest.mark.timeout(180)
def test_the_dashboard_plots_the_lag_of_known_reports(tmp_path):
    with embedded_authority(str(tmp_path / "wa"), extra_args=["--sample-interval", "0.2"]) as svc:
        wm = svc.client()
        now = int(time.time() * 1000)
        low = {"WindowCounter": now - 5_000, "DipDetector": now - 30_000}
        t = wm.acquire_many("WindowCounter", ["a-m", "n-z"])
        wm.report_batch("WindowCounter", [("a-m", t["a-m"], low["WindowCounter"], 3), ("n-z", t["n-z"], now - 2_000, 40)])
        d = wm.acquire("DipDetector", "all")
        wm.report("DipDetector", "all", d, low["DipDetector"])
        wm.expect_injector_processes("queries", ["reader-0", "reader-1"])
        wm.report_injector("queries", "reader-0", now - 1_000)
        deadline = time.monotonic() + 10
        while sum("DipDetector" in s["w"] for s in wm._call("GET", "/v1/history", params={"seconds": "60"})["samples"]) < 3:
            assert time.monotonic() < deadline, "the authority is not sampling"
            time.sleep(0.1)

        dom = render(svc.url + "/", str(tmp_path / "profile"))
        assert re.search(r'<body[^>]*data-rendered="1"', dom), "the page never rendered a chart"
        refreshes = int(re.search(r'data-refreshes="(\d+)"', dom).group(1))
        assert refreshes >= 2, "the page did not refresh itself"

        plotted = embedded_json(dom, "plotted")
        assert plotted["names"] == ["DipDetector", "WindowCounter", "queries"]
        assert plotted["canvas"] is True
        assert plotted["plot"]["series"] == ["DipDetector", "WindowCounter", "queries (injector)"]
        assert plotted["plot"]["points"] == plotted["samples"] >= 3
        for name, lw in low.items():
            lags = plotted["series"][name]
            points = [(x, lag) for x, lag in zip(plotted["x"], lags, strict=True) if lag is not None]
            assert len(points) >= 3, name
            for x, lag in points:  # every plotted point is exactly (sample time - low watermark)
                assert lag == pytest.approx(x - lw / 1000, abs=1e-3), (name, x, lag)
            assert lw / 1000 < points[-1][0]  # and the lag is positive: wall time is ahead
        assert 5 <= plotted["last"]["WindowCounter"] < 5 + 120
        assert 30 <= plotted["last"]["DipDetector"] < 30 + 120
        assert plotted["last"]["queries"] is None  # reader-1 never reported: nothing known, no lag
        y_min, y_max = plotted["plot"]["y"]
        assert y_min <= 0 and y_max >= plotted["last"]["DipDetector"]  # both lines fit on the axis

        drawn = embedded_json(dom, "drawn")
        assert drawn["DipDetector"] > 50 and drawn["WindowCounter"] > 50, f"lines not drawn on the canvas: {drawn}"

        wc = row(dom, "computations", "WindowCounter")
        assert f'data-low-watermark="{low["WindowCounter"]}"' in wc
        assert 'data-interval="a-m"' in wc  # a-m holds the watermark back
        assert f'data-low-watermark="{low["DipDetector"]}"' in row(dom, "computations", "DipDetector")
        q = row(dom, "injectors", "queries")
        assert f'data-low-watermark="{MIN_TIMESTAMP}"' in q or "MIN (nothing known)" in q
        assert 'data-process="reader-1"' in q and "missing (never reported)" in q

        # live: new reports show up on the next load, and the chart follows
        wm.report_batch("WindowCounter", [("a-m", t["a-m"], now - 1_000), ("n-z", t["n-z"], now - 500)])
        wm.report_injector("queries", "reader-1", now - 3_000)
        time.sleep(0.5)
        dom = render(svc.url + "/", str(tmp_path / "profile2"))
        plotted = embedded_json(dom, "plotted")
        assert plotted["last"]["WindowCounter"] < plotted["last"]["DipDetector"] - 20
        assert f'data-low-watermark="{now - 1_000}"' in row(dom, "computations", "WindowCounter")
        assert plotted["last"]["queries"] is not None and plotted["last"]["queries"] >= 3
        assert 'data-process="reader-1"' in row(dom, "injectors", "queries")  # now it is the one holding

        shot = tmp_path / "dashboard.png"
        render(svc.url + "/", str(tmp_path / "profile3"), screenshot=str(shot))
        assert shot.stat().st_size > 10_000
