// The authority's dashboard: how far each computation and injector lags behind wall time, and
// each computation behind its inputs (event time), over time (uPlot, log axis); what holds each
// watermark back and which process owns it; injector status. Polls /v1/status and /v1/history,
// which reveal no sequencer token and so need no secret.
// ?window=SECONDS (default 300) and ?refresh=MILLISECONDS (default 1000) tune it.
// #registry=URL&registry_key=KEY adds a panel of an IdRegistry's figures (Photon §2.2.1, §3.3.2), read
// from its /v1/stats with its read key (`millwheel photon run --dashboard` and
// `millwheel registry dashboard-link` print such an address); #metrics=URL links a run's metrics.
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
  const REGISTRY_WINDOW_S = Math.min(600, Math.max(1, Math.round(WINDOW_S))); // the registry keeps 10 minutes
  let refreshes = 0;
  let registryRefreshes = 0;

  function positive(text, otherwise) {
    const n = Number(text);
    return text !== null && Number.isFinite(n) && n > 0 ? n : otherwise;
  }

  // the page's other sources, from its fragment (never sent to any server): only http(s) URLs,
  // used as hrefs and fetch targets, never as markup
  const fragment = new URLSearchParams(location.hash.slice(1));
  function httpUrl(text) {
    let url;
    try { url = new URL(text || ""); } catch (e) { return null; }
    return url.protocol === "http:" || url.protocol === "https:" ? url : null;
  }

  // #metrics=URL (`millwheel run` prints the dashboard's address with it): a link to the run's
  // Prometheus endpoint in the header
  (function metricsLink() {
    const url = httpUrl(fragment.get("metrics"));
    if (url === null) return;
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
  // what each source's failures mean, by HTTP status
  const AUTHORITY = {
    unreachable: "authority unreachable",
    401: "secret required",
    403: "refused, this page's origin is not allowed",
    421: "host name not allowed (start the authority with --allow-host)",
    failed: "the authority failed",
  };
  const REGISTRY = {
    unreachable: "registry unreachable, or it refused this page (it answers pages of loopback origins and of its --allow-origin ones)",
    401: "the registry's read key is missing or wrong (open the address `millwheel photon run --dashboard` or `millwheel registry dashboard-link` prints)",
    403: "the registry refuses this page's origin (start it with --allow-origin " + location.origin + ")",
    421: "host name not allowed (start the registry with --allow-host)",
    failed: "the registry failed",
  };
  function explain(status, source) {
    if (source[status]) return "HTTP " + status + ": " + source[status];
    if (status >= 500) return "HTTP " + status + ": " + source.failed;
    return "HTTP " + status;
  }
  async function get(url, source, init) {
    let r;
    try {
      r = await fetch(url, Object.assign({ cache: "no-store" }, init));
    } catch (e) {
      throw new HttpError(0, source.unreachable + " (" + e.message + ")");
    }
    if (!r.ok) {
      let detail = "";
      try {
        detail = (await r.json()).message || "";
      } catch (e) {
        detail = r.statusText;
      }
      throw new HttpError(r.status, explain(r.status, source) + (detail ? " — " + String(detail).slice(0, 300) : ""));
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
      chart = charts[id] = { key: key, state: state, plot: null, names: names };
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
        hooks: { draw: [(u) => drawStuckGuide(u, chart.state), (u) => recordDrawn(u, style.drawnAs[id], "drawn", chart.names, style.color)] },
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

  // what a chart drew, recorded by uPlot's own draw hook, so it always belongs to the data just
  // drawn (a later timer could run after the page was read): per series, the points uPlot holds
  // inside its scale's range, and the pixels of the series' colour on the canvas
  const drawnBy = {};
  function recordDrawn(u, id, target, keys, colorOf) {
    const points = {};
    keys.forEach((k, i) => {
      const s = u.series[i + 1];
      const sc = u.scales[s.scale];
      points[k] = u.data[i + 1].filter((v) => v !== null && v !== undefined && v >= sc.min && v <= sc.max).length;
    });
    drawnBy[target] = drawnBy[target] || {};
    drawnBy[target][id] = { points: points, pixels: countPixels(u.ctx.canvas, keys, colorOf) };
    document.getElementById(target).textContent = JSON.stringify(drawnBy[target]);
  }

  function countPixels(canvas, names, colorOf) {
    const drawn = {};
    names.forEach((n) => { drawn[n] = 0; });
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
      drawnAs: { chart: "wall", "event-chart": "event" },
    };
    const plotted = {
      names: names,
      computations: comps,
      injectors: injs,
      wall: renderLagChart("chart", names, style, hist, (s, n) => wallLag(s.t, s.w, n)),
      event: renderLagChart("event-chart", comps, style, hist, (s, n) => eventLag(s.w, n, injs)),
    };
    document.getElementById("plotted").textContent = JSON.stringify(plotted);
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
      const count = cell(tr, String(c.intervals), "count");
      // the last rescale of its key intervals and why (the runtime's notes: its automatic
      // policy says which figures drove it), as text, never markup
      const notes = c.notes || [];
      if (notes.length) {
        const last = notes[notes.length - 1];
        const note = document.createElement("div");
        note.className = "note";
        note.textContent = fmtTs(last.at_ms).split(" (")[0] + ": " + last.text;
        count.appendChild(note);
      }
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

  // run ``step`` every REFRESH_MS; the indicator ``connectionId`` says "live" or what failed (HTTP
  // status and message, or unreachable); ``what`` names the part in an unexpected error
  function poll(connectionId, what, step) {
    const conn = document.getElementById(connectionId);
    async function once() {
      try {
        await step();
        conn.textContent = "live";
        conn.className = "ok";
        conn.dataset.status = "200";
      } catch (e) {
        conn.textContent = e instanceof HttpError ? e.message : what + " error: " + e.message;
        conn.className = "bad";
        conn.dataset.status = e instanceof HttpError ? String(e.status) : "";
      } finally {
        setTimeout(once, REFRESH_MS);
      }
    }
    once();
  }

  async function refresh() {
    const [status, hist] = await Promise.all([get("/v1/status", AUTHORITY), get("/v1/history?seconds=" + WINDOW_S, AUTHORITY)]);
    renderCharts(status, hist);
    renderTables(status);
    document.getElementById("clock").textContent = "authority time " + new Date(status.now).toISOString();
    refreshes += 1;
    document.body.dataset.refreshes = String(refreshes);
    if (hist.samples.length > 0) document.body.dataset.rendered = "1";
  }

  // ---------------------------------------------------------------- the IdRegistry panel
  // Its /v1/stats: counters, and per second the COMMITTED, CONFLICT and TOO_OLD answers, the commit
  // requests, and the durable writes (groups: Photon §2.2.1 server-side batching) with their ids.
  const REGISTRY_COLORS = {
    commits: "#1f77b4", conflicts: "#d62728", too_old: "#ff7f0e",
    ids_mean: "#2ca02c", ids_max: "#9467bd", requests_per_write: "#8c564b",
  };
  // one axis, asinh (linear near 0, logarithmic beyond): 5,000 commits/s and 3 conflicts/s both show, and 0 is 0
  const RATES = [
    { key: "commits", label: "commits/s", scale: "n" },
    { key: "conflicts", label: "conflicts/s", scale: "n" },
    { key: "too_old", label: "too old/s", scale: "n" },
  ];
  const BATCHES = [
    { key: "ids_mean", label: "ids per write (mean)", scale: "ids" },
    { key: "ids_max", label: "ids per write (max)", scale: "ids", dash: [6, 4] },
    { key: "requests_per_write", label: "requests per write (mean)", scale: "req" },
  ];
  const fmtCount = (n) => (typeof n === "number" ? n.toLocaleString("en-US") : "—");
  const fmtRate = (v) => (v === null || v === undefined ? "—" : Number.isInteger(v) ? fmtCount(v) : v.toFixed(1));

  // #registry=URL: the registry's base address; #registry_key=KEY: the read key of its secret
  const registry = (function () {
    const base = httpUrl(fragment.get("registry"));
    if (base === null) return null;
    const root = base.href.endsWith("/") ? base.href : base.href + "/";
    const key = fragment.get("registry_key");
    return {
      base: root.slice(0, -1),
      stats: new URL("v1/stats?seconds=" + REGISTRY_WINDOW_S, root).href,
      status: new URL("v1/status", root).href,
      badKey: key !== null && !/^[A-Za-z0-9_-]{16,200}$/.test(key),
      // the read key travels in a header (a CORS preflight), never in a URL; no cookies, no referrer
      init: {
        mode: "cors", credentials: "omit", referrerPolicy: "no-referrer",
        headers: key !== null && /^[A-Za-z0-9_-]{16,200}$/.test(key) ? { Authorization: "Bearer " + key } : {},
      },
    };
  })();

  // a chart of fixed series (the registry's), made once and then fed
  function renderSeriesChart(id, specs, x, ys, options) {
    const el = document.getElementById(id);
    const empty = x.length === 0 || !ys.some((s) => s.some((v) => v !== null));
    document.getElementById(id + "-empty").style.display = empty ? "" : "none";
    let chart = charts[id];
    if (!empty && chart === undefined) {
      chart = charts[id] = { key: id, plot: null };
      const series = [{}].concat(specs.map((s) => ({
        label: s.label, stroke: REGISTRY_COLORS[s.key], width: 2, dash: s.dash, scale: s.scale, spanGaps: false,
        value: (u, v) => fmtRate(v),
        // a second with writes between seconds without any is a point, not nothing
        points: s.scale === "ids" || s.scale === "req" ? { show: true, size: 5, fill: REGISTRY_COLORS[s.key] } : undefined,
      })));
      const keys = specs.map((s) => s.key);
      chart.plot = new uPlot(Object.assign({
        width: Math.max(600, el.clientWidth || 900), height: 300, series: series, legend: { live: true },
        hooks: { draw: [(u) => recordDrawn(u, id.replace("registry-", ""), "registry-drawn", keys, (k) => REGISTRY_COLORS[k])] },
      }, options), [x].concat(ys), el);
    } else if (!empty) {
      chart.plot.setData([x].concat(ys));
    }
    const out = { canvas: !!el.querySelector("canvas"), empty: empty };
    if (chart !== undefined && !empty) {
      const p = chart.plot;
      out.plot = { series: p.series.slice(1).map((s) => s.label), points: p.data[0].length,
        scales: Object.fromEntries(specs.map((s) => [s.scale, [p.scales[s.scale].min, p.scales[s.scale].max, p.scales[s.scale].distr]])) };
    }
    return out;
  }

  // label 0 and the powers of ten only (uPlot hands null for ticks it skips)
  function fmtDecade(v) {
    if (v === null || v === undefined || v < 0) return "";
    if (v === 0) return "0";
    return Math.abs(Math.log10(v) - Math.round(Math.log10(v))) < 1e-6 ? fmtCount(v) : "";
  }

  // a linear axis from 0 to a little above the highest value, at least to ``floor``
  function upTo(floor) {
    return (u, lo, hi) => [0, Math.max(floor, (hi || 0) * 1.15)];
  }

  function renderRegistry(stats) {
    const h = stats.history;
    const x = h.t.map((t) => t / 1000);
    const per = (fn) => h.t.map((t, i) => fn(i));
    const series = {
      commits: h.commits.slice(),
      conflicts: h.conflicts.slice(),
      too_old: h.too_old.slice(),
      ids_mean: per((i) => (h.groups[i] ? h.group_items[i] / h.groups[i] : null)),
      ids_max: per((i) => (h.groups[i] ? h.group_max[i] : null)),
      requests_per_write: per((i) => (h.groups[i] ? h.requests[i] / h.groups[i] : null)),
    };
    const decade = (v) => Math.pow(10, Math.ceil(Math.log10(Math.max(v, 1) * 2)));
    const top = decade(Math.max(1, ...h.group_max));
    const rateTop = decade(Math.max(1, ...h.commits, ...h.conflicts, ...h.too_old));
    const rates = renderSeriesChart("registry-rates", RATES, x, RATES.map((s) => series[s.key]), {
      scales: { x: { time: true }, n: { distr: 4, asinh: 1, range: () => [0, rateTop] } },
      axes: [{}, { scale: "n", label: "answers per second", size: 70, values: (u, splits) => splits.map(fmtDecade) }],
    });
    const batches = renderSeriesChart("registry-batches", BATCHES, x, BATCHES.map((s) => series[s.key]), {
      scales: { x: { time: true }, ids: { distr: 3, log: 10, range: () => [1, top] }, req: { range: upTo(2) } },
      axes: [{}, { scale: "ids", label: "ids per durable write", size: 70, values: (u, splits) => splits.map(fmtDecade) },
        { scale: "req", side: 1, label: "requests per write", size: 60, grid: { show: false } }],
    });
    renderRegistryTotals(stats);

    const sum = (xs) => xs.reduce((a, b) => a + b, 0);
    const plotted = {
      url: registry.base, seconds: x.length, x: x, series: series, totals: stats.totals, in_flight: stats.in_flight,
      sums: { commits: sum(h.commits), conflicts: sum(h.conflicts), too_old: sum(h.too_old), requests: sum(h.requests),
        groups: sum(h.groups), group_items: sum(h.group_items) },
      group_max: Math.max(0, ...h.group_max), rates: rates, batches: batches,
    };
    document.getElementById("registry-plotted").textContent = JSON.stringify(plotted);
  }

  function renderRegistryTotals(stats) {
    const t = stats.totals;
    const tr = document.createElement("tr");
    const put = (name, value, text) => { cell(tr, text === undefined ? fmtCount(value) : text, name).dataset.value = String(value); };
    put("committed", t.committed);
    put("repeated", t.repeated);
    put("conflicts", t.conflicts);
    put("too-old", t.too_old);
    put("requests", t.requests);
    put("groups", t.groups);
    const mean = t.groups ? t.group_items / t.groups : 0;
    put("ids-per-write", mean, t.groups ? mean.toFixed(1) : "—");
    put("sizes", Object.keys(t.group_sizes).length, Object.entries(t.group_sizes).map(([k, n]) => k.replace(/^(\d+)-\1$/, "$1") + ": " + fmtCount(n)).join(" · ") || "—");
    put("throttled", t.throttled);
    const f = stats.in_flight;
    put("in-flight", f.requests, fmtCount(f.requests) + " requests, " + fmtCount(f.items) + " ids");
    document.querySelector("#registry-totals tbody").replaceChildren(tr);
  }

  async function refreshRegistry() {
    if (registry.badKey) throw new HttpError(0, "the registry_key in this page's address is not a read key (43 letters, digits, - and _)");
    renderRegistry(await get(registry.stats, REGISTRY, registry.init));
    registryRefreshes += 1;
    document.body.dataset.registryRefreshes = String(registryRefreshes);
  }

  if (registry !== null) {
    const section = document.getElementById("registry");
    section.hidden = false;
    const a = document.getElementById("registry-link");
    a.href = registry.status;
    a.textContent = registry.base;
    poll("registry-connection", "registry panel", refreshRegistry);
  }

  window.addEventListener("resize", () => {
    for (const id of Object.keys(charts)) {
      const el = document.getElementById(id);
      charts[id].plot.setSize({ width: Math.max(600, el.clientWidth || 900), height: 300 });
    }
  });
  for (const label of document.querySelectorAll(".window-label")) label.textContent = String(Math.round(WINDOW_S / 60));
  document.getElementById("registry-window-label").textContent = String(Math.round(REGISTRY_WINDOW_S / 60));
  poll("connection", "dashboard", refresh);
})();
