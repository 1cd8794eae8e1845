// The authority's dashboard: watermark lag per computation over time (uPlot), what holds
// each watermark back, injector status. Polls /v1/status and /v1/history.
// ?window=SECONDS (default 300) and ?refresh=MILLISECONDS (default 1000) tune it.
(function () {
  "use strict";
  const params = new URLSearchParams(location.search);
  const WINDOW_S = Number(params.get("window") || 300);
  const REFRESH_MS = Number(params.get("refresh") || 1000);
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"];
  let plot = null;
  let plotKey = "";
  let refreshes = 0;

  // int64 timestamps arrive as doubles: anything this far out is MIN / MAX_TIMESTAMP
  const isMin = (v) => v <= -4e18;
  const isMax = (v) => v >= 4e18;

  function fmtTs(v) {
    if (isMin(v)) return "MIN (nothing known)";
    if (isMax(v)) return "MAX (finished)";
    return new Date(v).toISOString().replace("T", " ").replace("Z", " UTC") + " (" + v + ")";
  }
  function lagSeconds(now, v) {
    if (v === null || v === undefined || isMin(v) || isMax(v)) return null;
    return (now - v) / 1000;
  }
  function fmtLag(now, v) {
    if (isMax(v)) return "finished";
    const lag = lagSeconds(now, v);
    return lag === null ? "—" : lag.toFixed(1) + " s";
  }
  function fmtAge(now, t) {
    return t === null || t === undefined ? "never" : ((now - t) / 1000).toFixed(1) + " s ago";
  }
  async function get(path) {
    const r = await fetch(path, { cache: "no-store" });
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r.json();
  }
  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  function renderChart(status, hist) {
    const comps = Object.keys(status.computations).sort();
    const injs = Object.keys(status.injectors).sort();
    const names = comps.concat(injs);
    const x = [];
    const ys = names.map(() => []);
    for (const s of hist.samples) {
      x.push(s.t / 1000);
      names.forEach((n, i) => ys[i].push(n in s.w ? lagSeconds(s.t, s.w[n]) : null));
    }
    const empty = x.length === 0 || names.length === 0;
    document.getElementById("chart-empty").style.display = empty ? "" : "none";
    const chart = document.getElementById("chart");
    const key = JSON.stringify(names);
    if (!empty && (plot === null || key !== plotKey)) {
      if (plot !== null) plot.destroy();
      const series = [{}].concat(names.map((n, i) => ({
        label: i < comps.length ? n : n + " (injector)",
        stroke: COLORS[i % COLORS.length],
        width: 2,
        dash: i < comps.length ? undefined : [6, 4],
        spanGaps: false,
        value: (u, v) => (v === null || v === undefined ? "—" : v.toFixed(2) + " s"),
      })));
      plot = new uPlot({
        width: Math.max(600, chart.clientWidth || 900),
        height: 320,
        series: series,
        scales: { x: { time: true }, y: { range: (u, lo, hi) => [Math.min(0, lo), Math.max(1, hi * 1.1)] } },
        axes: [{}, { label: "lag (s)", size: 60 }],
        legend: { live: true },
      }, [x].concat(ys), chart);
      plotKey = key;
    } else if (!empty) {
      plot.setData([x].concat(ys));
    }
    const plotted = { names: names, samples: x.length, x: x, series: {}, last: {} };
    names.forEach((n, i) => {
      plotted.series[n] = ys[i];
      const vals = ys[i].filter((v) => v !== null);
      plotted.last[n] = vals.length ? vals[vals.length - 1] : null;
    });
    if (plot !== null && !empty) {
      // what uPlot itself holds, not just what we handed it
      plotted.plot = { series: plot.series.slice(1).map((s) => s.label), points: plot.data[0].length, y: [plot.scales.y.min, plot.scales.y.max] };
      plotted.canvas = !!chart.querySelector("canvas");
    }
    document.getElementById("plotted").textContent = JSON.stringify(plotted);
    // once uPlot has drawn (it paints in a microtask), count each series' pixels on the canvas
    if (plot !== null && !empty) setTimeout(() => countPixels(names), 0);
  }

  function countPixels(names) {
    const canvas = document.querySelector("#chart canvas");
    if (!canvas) return;
    const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    const rgb = names.map((n, i) => {
      const hex = COLORS[i % COLORS.length];
      return [1, 3, 5].map((k) => parseInt(hex.slice(k, k + 2), 16));
    });
    const counts = names.map(() => 0);
    for (let p = 0; p < data.length; p += 4) {
      if (data[p + 3] < 200) continue;
      for (let i = 0; i < rgb.length; i++) {
        const c = rgb[i];
        if (Math.abs(data[p] - c[0]) < 12 && Math.abs(data[p + 1] - c[1]) < 12 && Math.abs(data[p + 2] - c[2]) < 12) {
          counts[i] += 1;
          break;
        }
      }
    }
    const drawn = {};
    names.forEach((n, i) => { drawn[n] = counts[i]; });
    document.getElementById("drawn").textContent = JSON.stringify(drawn);
  }

  function renderTables(status) {
    const now = status.now;
    const ctb = document.querySelector("#computations tbody");
    ctb.replaceChildren();
    for (const name of Object.keys(status.computations).sort()) {
      const c = status.computations[name];
      const tr = document.createElement("tr");
      tr.dataset.name = name;
      tr.dataset.lowWatermark = String(c.low_watermark);
      cell(tr, name);
      cell(tr, fmtTs(c.low_watermark), "lw");
      cell(tr, fmtLag(now, c.low_watermark), "lag");
      const p99 = c.percentiles["99.000"];
      cell(tr, p99 === undefined ? "—" : fmtTs(p99), "p99");
      const h = c.holding;
      const held = cell(tr, h ? h.interval + (h.updated_ms === null ? " (never reported)" : "") : "no intervals", "holding");
      if (h) held.dataset.interval = h.interval;
      if (h && h.updated_ms === null) held.classList.add("missing");
      cell(tr, h ? fmtTs(h.value) : "—", "holding-value");
      cell(tr, h ? fmtAge(now, h.updated_ms) : "—", "age");
      cell(tr, String(c.intervals), "count");
      ctb.appendChild(tr);
    }
    const itb = document.querySelector("#injectors tbody");
    itb.replaceChildren();
    for (const name of Object.keys(status.injectors).sort()) {
      const j = status.injectors[name];
      const tr = document.createElement("tr");
      tr.dataset.name = name;
      tr.dataset.lowWatermark = String(j.low_watermark);
      cell(tr, name);
      cell(tr, fmtTs(j.low_watermark), "lw");
      cell(tr, fmtLag(now, j.low_watermark), "lag");
      const h = j.holding;
      const held = cell(tr, h ? h.process + (h.reported ? "" : " (missing)") : "no processes", "holding");
      if (h) held.dataset.process = h.process;
      if (h && !h.reported) held.classList.add("missing");
      const td = cell(tr, "", "processes");
      for (const p of Object.keys(j.processes)) {
        const info = j.processes[p];
        const span = document.createElement("span");
        span.className = "proc" + (info.reported ? "" : " missing");
        span.dataset.process = p;
        span.dataset.reported = String(info.reported);
        span.textContent = p + ": " + (info.reported ? fmtTs(info.value) + ", " + fmtAge(now, info.updated_ms) : "missing (never reported)");
        td.appendChild(span);
      }
      itb.appendChild(tr);
    }
  }

  async function refresh() {
    const conn = document.getElementById("connection");
    try {
      const [status, hist] = await Promise.all([get("/v1/status"), get("/v1/history?seconds=" + WINDOW_S)]);
      renderChart(status, hist);
      renderTables(status);
      document.getElementById("clock").textContent = "authority time " + new Date(status.now).toISOString();
      conn.textContent = "live";
      conn.className = "ok";
      refreshes += 1;
      document.body.dataset.refreshes = String(refreshes);
      if (hist.samples.length > 0) document.body.dataset.rendered = "1";
    } catch (e) {
      conn.textContent = "authority unreachable: " + e.message;
      conn.className = "bad";
    } finally {
      setTimeout(refresh, REFRESH_MS);
    }
  }

  window.addEventListener("resize", () => {
    if (plot !== null) plot.setSize({ width: Math.max(600, document.getElementById("chart").clientWidth || 900), height: 320 });
  });
  document.getElementById("window-label").textContent = String(Math.round(WINDOW_S / 60));
  refresh();
})();
