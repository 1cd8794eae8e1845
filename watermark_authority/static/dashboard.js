// The authority's dashboard: how far each computation and injector lags behind wall time, and
// each computation behind its inputs (event time), over time (uPlot, log axis); what holds each
// watermark back and which process owns it; injector status. Polls /v1/status and /v1/history,
// which reveal no sequencer token and so need no secret.
// ?window=SECONDS (default 300) and ?refresh=MILLISECONDS (default 1000) tune it.
(function () {
  "use strict";
  const params = new URLSearchParams(location.search);
  const WINDOW_S = positive(params.get("window"), 300);
  const REFRESH_MS = positive(params.get("refresh"), 1000);
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"];
  const GUIDE = "#b71c1c"; // the "stuck at MIN" guide: far enough from every series colour
  const FLOOR = 0.1; // seconds: smaller (and negative) lags are drawn here on the log axis
  const STUCK_STEP = 1.15; // each stuck line sits this factor above the previous one
  const STUCK = "stuck"; // a sample at MIN_TIMESTAMP: nothing known
  const charts = {}; // element id -> {plot, key, state}
  let refreshes = 0;

  function positive(text, otherwise) {
    const n = Number(text);
    return text !== null && Number.isFinite(n) && n > 0 ? n : otherwise;
  }

  // #metrics=URL (`millwheel run` prints the dashboard's address with it): a link to the run's
  // Prometheus endpoint in the header; only an http(s) URL, set as an href, never as markup
  (function metricsLink() {
    let url;
    try { url = new URL(new URLSearchParams(location.hash.slice(1)).get("metrics") || ""); } catch (e) { return; }
    if (url.protocol !== "http:" && url.protocol !== "https:") return;
    const a = document.createElement("a");
    a.id = "metrics-link"; a.href = url.href; a.rel = "noopener noreferrer"; a.textContent = "metrics";
    document.querySelector("header").appendChild(a);
  })();

  // int64 timestamps arrive as doubles: anything this far out is MIN / MAX_TIMESTAMP
  const isMin = (v) => v <= -4e18;
  const isMax = (v) => v >= 4e18;

  function fmtTs(v) {
    if (isMin(v)) return "MIN — nothing known";
    if (isMax(v)) return "MAX (finished)";
    return new Date(v).toISOString().replace("T", " ").replace("Z", " UTC") + " (" + v + ")";
  }
  function fmtDur(sec) {
    const a = Math.abs(sec);
    if (a < 1) return sec.toFixed(2) + " s";
    if (a < 120) return sec.toFixed(1) + " s";
    if (a < 7200) return (sec / 60).toFixed(1) + " min";
    if (a < 172800) return (sec / 3600).toFixed(1) + " h";
    return (sec / 86400).toFixed(1) + " d";
  }
  // log-axis ticks: label the powers of ten only (uPlot hands null for ticks it skips)
  function fmtTick(sec) {
    if (sec === null || sec === undefined || sec <= 0) return "";
    const e = Math.log10(sec);
    if (Math.abs(e - Math.round(e)) > 1e-6) return "";
    return fmtDur(sec).replace(/\.0+ /, " ").replace(/^0\.10 s$/, "0.1 s");
  }
  function fmtAge(now, t) {
    return t === null || t === undefined ? "never" : fmtDur((now - t) / 1000) + " ago";
  }

  // ---------------------------------------------------------------- lags
  // Each is a number of seconds, STUCK (the watermark is MIN: nothing known) or null (absent,
  // finished, or not defined).
  function wallLag(t, w, name) {
    if (!(name in w)) return null;
    const v = w[name];
    if (isMin(v)) return STUCK;
    if (isMax(v)) return null;
    return (t - v) / 1000;
  }
  // the lowest injector watermark: null if there is none or one is MIN, Infinity if all finished
  function inputsLow(w, injectors) {
    let low = Infinity;
    let any = false;
    for (const j of injectors) {
      if (!(j in w)) continue;
      any = true;
      if (isMin(w[j])) return null;
      if (!isMax(w[j])) low = Math.min(low, w[j]);
    }
    return any ? low : null;
  }
  // lag of a computation behind its inputs: min injector watermark - computation watermark
  function eventLag(w, name, injectors) {
    if (!(name in w)) return null;
    const v = w[name];
    if (isMin(v)) return STUCK;
    if (isMax(v)) return null;
    const low = inputsLow(w, injectors);
    return low === null || low === Infinity ? null : (low - v) / 1000;
  }

  // ---------------------------------------------------------------- HTTP
  class HttpError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }
  function explain(status) {
    if (status === 401) return "HTTP 401: secret required";
    if (status === 403) return "HTTP 403: refused, this page's origin is not allowed";
    if (status === 421) return "HTTP 421: host name not allowed (start the authority with --allow-host)";
    if (status >= 500) return "HTTP " + status + ": the authority failed";
    return "HTTP " + status;
  }
  async function get(path) {
    let r;
    try {
      r = await fetch(path, { cache: "no-store" });
    } catch (e) {
      throw new HttpError(0, "authority unreachable (" + e.message + ")");
    }
    if (!r.ok) {
      let detail = "";
      try {
        detail = (await r.json()).message || "";
      } catch (e) {
        detail = r.statusText;
      }
      throw new HttpError(r.status, explain(r.status) + (detail ? " — " + String(detail).slice(0, 300) : ""));
    }
    return r.json();
  }

  // ---------------------------------------------------------------- charts
  function renderLagChart(id, names, style, hist, lagOf) {
    const el = document.getElementById(id);
    const x = hist.samples.map((s) => s.t / 1000);
    const lags = names.map((n) => hist.samples.map((s) => lagOf(s, n)));
    let maxLag = 0;
    lags.forEach((ys) => ys.forEach((v) => { if (typeof v === "number" && v > maxLag) maxLag = v; }));
    const ceiling = Math.pow(10, Math.ceil(Math.log10(Math.max(maxLag, 1) * 3)));
    const stuckNames = names.filter((n, i) => lags[i].some((v) => v === STUCK));
    const levels = {};
    stuckNames.forEach((n, k) => { levels[n] = ceiling * Math.pow(STUCK_STEP, k); });
    const drawn = names.map((n, i) => lags[i].map((v) => (v === STUCK ? levels[n] : v === null ? null : Math.max(v, FLOOR))));
    const empty = x.length === 0 || !drawn.some((ys) => ys.some((v) => v !== null));
    document.getElementById(id + "-empty").style.display = empty ? "" : "none";

    const state = { ceiling: ceiling, stuck: stuckNames.length, lags: lags,
      top: ceiling * Math.pow(STUCK_STEP, Math.max(stuckNames.length, 1)) * 1.4 };
    const key = JSON.stringify(names.map(style.label));
    let chart = charts[id];
    if (!empty && (chart === undefined || chart.key !== key)) {
      if (chart !== undefined) chart.plot.destroy();
      chart = charts[id] = { key: key, state: state, plot: null };
      const series = [{}].concat(names.map((n, i) => ({
        label: style.label(n),
        stroke: style.color(n),
        width: 2,
        dash: style.dashed(n) ? [6, 4] : undefined,
        spanGaps: false,
        value: (u, v, si, di) => {
          const t = di === null || di === undefined ? null : chart.state.lags[i][di];
          return t === STUCK ? "nothing known (MIN)" : t === null || t === undefined ? "—" : fmtDur(t);
        },
      })));
      chart.plot = new uPlot({
        width: Math.max(600, el.clientWidth || 900),
        height: 300,
        series: series,
        scales: { x: { time: true }, y: { distr: 3, log: 10, range: () => [FLOOR, chart.state.top] } },
        axes: [{}, { label: "lag", size: 70, values: (u, splits) => splits.map(fmtTick) }],
        legend: { live: true },
        hooks: { draw: [(u) => drawStuckGuide(u, chart.state)] },
      }, [x].concat(drawn), el);
    } else if (!empty) {
      chart.state = state;
      chart.plot.setData([x].concat(drawn));
    }

    const out = { names: names, samples: x.length, x: x, series: {}, drawn: {}, last: {}, latest: {}, stuck: [],
      ceiling: ceiling, floor: FLOOR, levels: levels, positions: {} };
    names.forEach((n, i) => {
      out.series[n] = lags[i];
      out.drawn[n] = drawn[i];
      const known = lags[i].filter((v) => v !== null);
      out.last[n] = known.length ? known[known.length - 1] : null;
      out.latest[n] = lags[i].length ? lags[i][lags[i].length - 1] : null;
      if (out.latest[n] === STUCK) out.stuck.push(n);
    });
    if (chart !== undefined && !empty) {
      const p = chart.plot;
      // what uPlot itself holds and where it put each line's last point, not just what we handed it
      out.plot = { series: p.series.slice(1).map((s) => s.label), points: p.data[0].length, y: [p.scales.y.min, p.scales.y.max], distr: p.scales.y.distr,
        floor_position: p.valToPos(FLOOR, "y") };
      names.forEach((n, i) => {
        const ys = drawn[i].filter((v) => v !== null);
        out.positions[n] = ys.length ? p.valToPos(ys[ys.length - 1], "y") : null;
      });
      out.canvas = !!el.querySelector("canvas");
    }
    return out;
  }

  // a dashed guide just under the stuck lines, labelled, so "nothing known" cannot pass for a lag
  function drawStuckGuide(u, state) {
    if (!state.stuck) return;
    const ctx = u.ctx;
    const y = u.valToPos(state.ceiling / 1.25, "y", true);
    const ratio = window.devicePixelRatio || 1;
    ctx.save();
    ctx.strokeStyle = GUIDE;
    ctx.fillStyle = GUIDE;
    ctx.lineWidth = ratio;
    ctx.setLineDash([3 * ratio, 5 * ratio]);
    ctx.beginPath();
    ctx.moveTo(u.bbox.left, y);
    ctx.lineTo(u.bbox.left + u.bbox.width, y);
    ctx.stroke();
    ctx.font = (11 * ratio) + "px system-ui, sans-serif";
    ctx.textAlign = "right";
    ctx.fillText("▲ stuck at MIN: nothing known", u.bbox.left + u.bbox.width - 4 * ratio, y + 13 * ratio);
    ctx.restore();
  }

  // once uPlot has drawn (it paints in a microtask), count each series' pixels on a chart's canvas
  function countPixels(id, names, colorOf) {
    const canvas = document.querySelector("#" + id + " canvas");
    const drawn = {};
    names.forEach((n) => { drawn[n] = 0; });
    if (!canvas) return drawn;
    const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    const rgb = names.map((n) => { const hex = colorOf(n); return [1, 3, 5].map((k) => parseInt(hex.slice(k, k + 2), 16)); });
    for (let p = 0; p < data.length; p += 4) {
      if (data[p + 3] < 200) continue;
      for (let i = 0; i < rgb.length; i++) {
        const c = rgb[i];
        if (Math.abs(data[p] - c[0]) < 12 && Math.abs(data[p + 1] - c[1]) < 12 && Math.abs(data[p + 2] - c[2]) < 12) {
          drawn[names[i]] += 1;
          break;
        }
      }
    }
    return drawn;
  }

  function renderCharts(status, hist) {
    const comps = Object.keys(status.computations).sort();
    const injs = Object.keys(status.injectors).sort();
    const names = comps.concat(injs);
    const colorOf = (n) => COLORS[names.indexOf(n) % COLORS.length];
    const style = {
      label: (n) => (injs.includes(n) ? n + " (injector)" : n),
      color: colorOf,
      dashed: (n) => injs.includes(n),
    };
    const plotted = {
      names: names,
      computations: comps,
      injectors: injs,
      wall: renderLagChart("chart", names, style, hist, (s, n) => wallLag(s.t, s.w, n)),
      event: renderLagChart("event-chart", comps, style, hist, (s, n) => eventLag(s.w, n, injs)),
    };
    document.getElementById("plotted").textContent = JSON.stringify(plotted);
    setTimeout(() => {
      const drawn = { wall: countPixels("chart", names, colorOf), event: countPixels("event-chart", comps, colorOf) };
      document.getElementById("drawn").textContent = JSON.stringify(drawn);
    }, 0);
  }

  // ---------------------------------------------------------------- tables
  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }
  function fmtWallLag(now, v) {
    if (isMin(v)) return "stuck: nothing known";
    if (isMax(v)) return "finished";
    return fmtDur((now - v) / 1000);
  }
  function fmtEventLag(w, name, injectors) {
    const lag = eventLag(w, name, injectors);
    if (lag === STUCK) return "stuck: nothing known";
    if (typeof lag === "number") return fmtDur(lag);
    if (isMax(w[name])) return "finished";
    if (injectors.length === 0) return "no injectors";
    return inputsLow(w, injectors) === null ? "inputs: nothing known" : "inputs finished";
  }

  function renderTables(status) {
    const now = status.now;
    const injs = Object.keys(status.injectors);
    const w = {};
    for (const [n, c] of Object.entries(status.computations)) w[n] = c.low_watermark;
    for (const [n, j] of Object.entries(status.injectors)) w[n] = j.low_watermark;

    const ctb = document.querySelector("#computations tbody");
    ctb.replaceChildren();
    for (const name of Object.keys(status.computations).sort()) {
      const c = status.computations[name];
      const tr = document.createElement("tr");
      tr.dataset.name = name;
      tr.dataset.lowWatermark = String(c.low_watermark);
      if (isMin(c.low_watermark)) tr.classList.add("stuck");
      cell(tr, name);
      cell(tr, fmtTs(c.low_watermark), "lw");
      cell(tr, fmtWallLag(now, c.low_watermark), "lag");
      cell(tr, fmtEventLag(w, name, injs), "event-lag");
      const p99 = c.percentiles["99.000"];
      cell(tr, p99 === undefined ? "—" : fmtTs(p99), "p99");
      const h = c.holding;
      const held = cell(tr, h ? h.interval + (h.updated_ms === null ? " (never reported)" : "") : "no key intervals", "holding");
      if (h) held.dataset.interval = h.interval;
      if (h && h.updated_ms === null) held.classList.add("missing");
      const owner = cell(tr, h ? h.owner || "unknown" : "—", "owner");
      if (h && h.owner) owner.dataset.owner = h.owner;
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
      if (isMin(j.low_watermark)) tr.classList.add("stuck");
      cell(tr, name);
      cell(tr, fmtTs(j.low_watermark), "lw");
      cell(tr, fmtWallLag(now, j.low_watermark), "lag");
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
      renderCharts(status, hist);
      renderTables(status);
      document.getElementById("clock").textContent = "authority time " + new Date(status.now).toISOString();
      conn.textContent = "live";
      conn.className = "ok";
      conn.dataset.status = "200";
      refreshes += 1;
      document.body.dataset.refreshes = String(refreshes);
      if (hist.samples.length > 0) document.body.dataset.rendered = "1";
    } catch (e) {
      conn.textContent = e instanceof HttpError ? e.message : "dashboard error: " + e.message;
      conn.className = "bad";
      conn.dataset.status = e instanceof HttpError ? String(e.status) : "";
    } finally {
      setTimeout(refresh, REFRESH_MS);
    }
  }

  window.addEventListener("resize", () => {
    for (const id of Object.keys(charts)) {
      const el = document.getElementById(id);
      charts[id].plot.setSize({ width: Math.max(600, el.clientWidth || 900), height: 300 });
    }
  });
  for (const label of document.querySelectorAll(".window-label")) label.textContent = String(Math.round(WINDOW_S / 60));
  refresh();
})();
