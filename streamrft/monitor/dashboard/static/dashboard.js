// The dashboard page: applies /api/events' updates (whole lines downsampled, then only what is
// new) and draws them with Chart.js; fills the trajectory viewer from /api/groups. Plain JS, no
// build step; the chart library is vendored (scripts/install.sh).
"use strict";

const charts = {};
window.dashboardCharts = charts;  // for people in the console and for the browser test
window.dashboardPerf = [];  // per update applied: {points, charts, ms} (the newest 200)
window.dashboardStats = { messages: 0, bytes: 0 };
const COLORS = ["#1d3557", "#e76f51", "#2a9d8f", "#e9c46a", "#8338ec", "#f4a261", "#457b9d", "#6a994e",
  "#bc4749", "#118ab2"];
const store = { lines: {}, tables: {} };  // page key -> {chart, x, label, points: [[x, y], ...]}
const saved = (name, fallback) => JSON.parse(localStorage.getItem("streamrft." + name) || "null") ?? fallback;
const save = (name, value) => localStorage.setItem("streamrft." + name, JSON.stringify(value));
const hidden = saved("hidden", {});  // chart -> {label: true}: legends remember what was hidden
const logScale = saved("log", {});  // chart -> true
let smoothing = saved("smoothing", 0.6);
const zoom = {};  // chart -> {min, max, data: {key: points}, seq} while zoomed in

const TIME = "seconds since the run's first record";
const LINE_CHARTS = {
  reward_time: { canvas: "c-reward-time", xTitle: TIME, yTitle: "reward" },
  reward_version: { canvas: "c-reward-version", xTitle: "version", yTitle: "reward" },
  trainer: { canvas: "c-trainer", xTitle: "trainer step", yTitle: "seconds", zero: true },
  offpolicy: { canvas: "c-offpolicy", xTitle: "trainer step", yTitle: "weight, share of tokens, or versions" },
  streamops: { canvas: "c-streamops", xTitle: TIME, yTitle: "seconds (p50 in the last interval)", zero: true },
  versions: { canvas: "c-versions", xTitle: TIME, yTitle: "version", integer: true, stepped: true, raw: true },
  feedback: { canvas: "c-feedback", xTitle: TIME, yTitle: "groups, or seconds", zero: true, raw: true, optional: true },
};

const num = (v, d = 3) => (v === null || v === undefined ? "-" : (+v).toFixed(d));
const t0 = () => store.tables.t0 || 0;
const isTime = (c) => c.x === "time";

// ---- line charts ------------------------------------------------------------------------------
function ema(points, weight) {
  // TensorBoard's smoothing: an exponential moving average, debiased for its first points
  let last = 0, n = 0;
  return points.map(([x, y]) => {
    last = last * weight + (1 - weight) * y;
    n += 1;
    return [x, last / (1 - Math.pow(weight, n))];
  });
}

function lineChart(name) {
  if (typeof Chart === "undefined") return null;
  if (charts[name]) return charts[name];
  const def = LINE_CHARTS[name];
  const c = new Chart(document.getElementById(def.canvas), {
    type: "line", data: { datasets: [] },
    options: {
      animation: false, responsive: true, maintainAspectRatio: false, parsing: false,
      interaction: { mode: "nearest", intersect: false },
      scales: {
        x: { type: "linear", title: { display: true, text: def.xTitle } },
        y: { type: logScale[name] ? "logarithmic" : "linear", beginAtZero: !!def.zero,
          title: { display: true, text: def.yTitle }, ticks: def.integer ? { precision: 0 } : {} },
      },
      plugins: {
        legend: {
          labels: { boxWidth: 10, font: { size: 11 }, filter: (item, data) => !data.datasets[item.datasetIndex].isRaw },
          onClick: (e, item, legend) => {
            const label = legend.chart.data.datasets[item.datasetIndex].label;
            hidden[name] = hidden[name] || {};
            hidden[name][label] = !hidden[name][label];
            save("hidden", hidden);
            drawLines(name);
          },
        },
        tooltip: { filter: (item) => !item.dataset.isRaw || item.chart.data.datasets.length === 1 },
      },
    },
  });
  c.streamrftName = name;
  charts[def.canvas] = charts[name] = c;
  addZoom(name, c);
  return c;
}

function chartKeys(name) {
  return Object.keys(store.lines).filter((k) => store.lines[k].chart === name);
}

function timeRange() {
  // every time chart shows the same span: the run's first record to its newest point
  let max = 0;
  for (const l of Object.values(store.lines)) {
    if (isTime(l) && l.points.length) max = Math.max(max, l.points[l.points.length - 1][0] - t0());
  }
  return max;
}

function drawLines(name) {
  const def = LINE_CHARTS[name];
  if (def.optional) {  // a chart only some runs have (the feedback join's): shown once it has a line
    const fig = document.querySelector(`figure[data-chart="${name}"]`);
    if (fig) fig.hidden = chartKeys(name).length === 0;
  }
  const c = lineChart(name);
  if (!c) return;
  const z = zoom[name];
  const datasets = [];
  chartKeys(name).forEach((key, i) => {
    const l = store.lines[key];
    const shift = isTime(l) ? t0() : 0;
    const pts = (z && z.data && z.data[key]) || l.points;
    const data = pts.map(([x, y]) => ({ x: x - shift, y }));
    const color = COLORS[i % COLORS.length], isEval = l.label.includes("eval");
    const off = !!(hidden[name] && hidden[name][l.label]);
    const smooth = !def.raw && !isEval && smoothing > 0 && data.length > 2;
    const base = { label: l.label, borderColor: color, backgroundColor: color, borderWidth: 1.5, hidden: off,
      stepped: !!def.stepped };
    if (smooth) {
      datasets.push({ ...base, data, isRaw: true, showLine: false, pointRadius: 1, borderColor: color + "40",
        backgroundColor: color + "40" });
      datasets.push({ ...base, data: ema(pts, smoothing).map(([x, y]) => ({ x: x - shift, y })), pointRadius: 0 });
    } else {
      // the launcher's evals are a run's start and end: points, not a line joining them
      datasets.push({ ...base, data, showLine: !l.label.includes("launcher"), pointRadius: isEval ? 3 : (data.length > 300 ? 0 : 1.5) });
    }
  });
  c.data.datasets = datasets;
  const x = c.options.scales.x;
  if (z) { x.min = z.min; x.max = z.max; } else if (def.xTitle === TIME) { x.min = 0; x.max = Math.ceil(timeRange()); }
  else { delete x.min; delete x.max; }
  c.options.scales.y.type = logScale[name] ? "logarithmic" : "linear";
  c.update("none");
}

// ---- zoom and pan: drag across to zoom in, shift-drag to pan, double-click to zoom out ----------
function addZoom(name, c) {
  const canvas = c.canvas, fig = canvas.closest("figure");
  let start = null, box = null, panFrom = null;
  canvas.addEventListener("mousedown", (e) => {
    if (e.shiftKey) { panFrom = { px: e.offsetX, min: c.scales.x.min, max: c.scales.x.max }; return; }
    start = e.offsetX;
    box = document.createElement("div");
    box.className = "selection";
    box.style.top = canvas.offsetTop + c.chartArea.top + "px";
    box.style.height = c.chartArea.bottom - c.chartArea.top + "px";
    fig.append(box);
  });
  canvas.addEventListener("mousemove", (e) => {
    if (panFrom) {
      const per = (panFrom.max - panFrom.min) / (c.chartArea.right - c.chartArea.left);
      const dx = (e.offsetX - panFrom.px) * per;
      setZoom(name, panFrom.min - dx, panFrom.max - dx);
    } else if (box) {
      box.style.left = canvas.offsetLeft + Math.min(start, e.offsetX) + "px";
      box.style.width = Math.abs(e.offsetX - start) + "px";
    }
  });
  const end = (e) => {
    if (box) {
      box.remove(); box = null;
      if (Math.abs(e.offsetX - start) > 5) {
        const a = c.scales.x.getValueForPixel(Math.min(start, e.offsetX)), b = c.scales.x.getValueForPixel(Math.max(start, e.offsetX));
        setZoom(name, a, b);
      }
    }
    start = null; panFrom = null;
  };
  canvas.addEventListener("mouseup", end);
  canvas.addEventListener("mouseleave", (e) => { if (box || panFrom) end(e); });
  canvas.addEventListener("dblclick", () => setZoom(name, null, null));
}

let zoomSeq = 0;
function setZoom(name, min, max) {
  const caption = document.querySelector(`figure[data-chart=${name}] .reset`);
  if (min === null) {
    delete zoom[name];
    if (caption) caption.hidden = true;
    drawLines(name);
    return;
  }
  const seq = ++zoomSeq;
  zoom[name] = { min, max, data: (zoom[name] || {}).data, seq };
  if (caption) caption.hidden = false;
  drawLines(name);
  clearTimeout(zoom[name].timer);
  zoom[name].timer = setTimeout(async () => {
    // the zoomed span at full resolution (downsampled only where it still holds more than 1,000 points)
    const keys = chartKeys(name);
    if (!keys.length) return;
    const shift = isTime(store.lines[keys[0]]) ? t0() : 0;
    const q = new URLSearchParams({ keys: keys.join(","), x0: min + shift, x1: max + shift });
    const res = await (await fetch("/api/lines?" + q)).json();
    if (!zoom[name] || zoom[name].seq !== seq) return;  // zoomed again, or out, meanwhile
    zoom[name].data = res.lines;
    drawLines(name);
  }, 150);
}

function addChartTools() {
  for (const fig of document.querySelectorAll("figure[data-chart]")) {
    const name = fig.dataset.chart, cap = fig.querySelector("figcaption");
    const tools = document.createElement("span");
    tools.className = "tools";
    const reset = document.createElement("button");
    reset.type = "button"; reset.className = "reset"; reset.textContent = "zoom out"; reset.hidden = true;
    reset.onclick = () => setZoom(name, null, null);
    const log = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox"; box.checked = !!logScale[name];
    box.onchange = () => { logScale[name] = box.checked; save("log", logScale); drawLines(name); };
    log.append(box, " log scale");
    tools.append(reset, log);
    cap.append(tools);
  }
  const slider = document.getElementById("smoothing"), shown = document.getElementById("smoothing-value");
  slider.value = smoothing; shown.textContent = (+smoothing).toFixed(2);
  slider.oninput = () => {
    smoothing = +slider.value; shown.textContent = smoothing.toFixed(2); save("smoothing", smoothing);
    Object.keys(LINE_CHARTS).forEach(drawLines);
  };
}

// ---- bar charts and tables ------------------------------------------------------------------------
function bars(id, labels, series, xTitle, yTitle, extra = {}) {
  if (typeof Chart === "undefined") return;
  if (!charts[id]) {
    // the axes are set once, here: Chart.js's resolved options are proxies, not to be copied later
    const horizontal = extra.indexAxis === "y";
    const [cat, val] = horizontal ? ["y", "x"] : ["x", "y"];
    const given = extra.scales || {};
    const scales = {
      [cat]: { ...(given[cat] || {}), title: { display: true, text: xTitle } },
      [val]: { ...(given[val] || {}), beginAtZero: true, title: { display: true, text: yTitle },
        ticks: yTitle.startsWith("share") ? {} : { precision: 0 } },
    };
    charts[id] = new Chart(document.getElementById(id), {
      type: "bar", data: { labels: [], datasets: [] },
      options: { animation: false, responsive: true, maintainAspectRatio: false, indexAxis: extra.indexAxis || "x",
        scales, plugins: { legend: { labels: { boxWidth: 10, font: { size: 11 } } } } },
    });
  }
  const c = charts[id];
  c.data.labels = labels.length ? labels : ["none yet"];  // an empty chart would look broken
  c.data.datasets = series.map((s, i) => ({ label: s.label, data: labels.length ? s.values : [0],
    backgroundColor: COLORS[i % COLORS.length] }));
  c.update("none");
}

function drawTables(t) {
  const ns = t.namespace || "";
  document.getElementById("ns").textContent = (t.runs || [ns]).join(" vs ");
  const tr = t.trainer || {}, ev = t.last_eval;
  document.getElementById("headline").textContent =
    `step ${tr.step ?? "-"} · version ${tr.version ?? "-"} · train reward ${num(tr.reward_mean)} · ` +
    `eval ${ev ? `${num(ev.reward)} (v${ev.version}, ${ev.source})` : "-"} · experiences ${t.groups_seen} groups`;
  const f = t.finished, fin = document.getElementById("final");
  fin.hidden = !f;
  if (f) {
    fin.textContent = `finished: eval ${num(f.eval_reward_start)} → ${num(f.eval_reward_end)} · ${f.versions} versions · ` +
      `${f.trajectories} trajectories · trained ${f.trained} · stale ${f.stale} (${num(f.stale_pct, 1)} %) · ${num(f.wall_s, 0)} s`;
  }
  setBadge();
  document.title = `streamrft · ${ns}${f ? " (finished)" : ""}`;
  const st = Object.keys(t.staleness || {});
  bars("c-staleness", st, [{ label: "trajectories", values: st.map((k) => t.staleness[k]) }],
    "staleness (versions behind the newest announced)", "trajectories");
  const ex = Object.keys(t.explorer_stages || {});
  const stages = [...new Set(ex.flatMap((e) => Object.keys(t.explorer_stages[e])))];
  bars("c-stages", ex, stages.map((s) => ({ label: s, values: ex.map((e) => t.explorer_stages[e][s] || 0) })),
    "explorer", "share of wall time", { scales: { x: { stacked: true }, y: { stacked: true, max: 1 } } });
  const lagLabels = [], lagValues = [];
  for (const [g, topics] of Object.entries(t.lag || {})) for (const [tp, n] of Object.entries(topics)) {
    lagLabels.push(`${g.slice(ns.length + 1)} ← ${tp.slice(ns.length + 1)}`); lagValues.push(n);
  }
  bars("c-lag", lagLabels, [{ label: "records behind", values: lagValues }], "consumer group ← topic", "records behind",
    { indexAxis: "y" });
  const dr = Object.keys(t.dead_reasons || {});
  bars("c-dead", dr, [{ label: "dead letters", values: dr.map((k) => t.dead_reasons[k]) }], "reason", "dead letters",
    { indexAxis: "y" });
  teamsTable(t.teams || {});
  deadTable(t.dead_letters || []);
  options(document.querySelector("#filters [name=finish]"), t.finish_reasons || []);
}

function table(el, head, rows) {
  el.replaceChildren();
  const tr = el.insertRow();
  head.forEach((h, i) => {
    const th = document.createElement("th");
    th.textContent = h;
    if (!i) th.className = "l";
    tr.append(th);
  });
  for (const r of rows) {
    const row = el.insertRow();
    r.forEach((v) => {
      const td = row.insertCell();
      td.textContent = v;
      if (isNaN(+v)) td.className = "l";  // text left, numbers right
    });
  }
}

function options(select, values) {
  for (const v of values) if (![...select.options].some((o) => o.value === v)) select.add(new Option(v, v));
}

function teamsTable(teams) {
  const cols = ["groups", "trajectories", "reward_mean", "trained_tokens", "masked_tokens", "episodes",
    "prompt_tokens", "completion_tokens", "rejected", "expired", "dead_letters"];
  table(document.getElementById("teams"), ["team", ...cols], Object.entries(teams).map(([t, r]) =>
    [t, ...cols.map((c) => (r[c] === undefined ? "-" : c === "reward_mean" ? num(r[c]) : String(Math.round(r[c]))))]));
  options(document.querySelector("#filters [name=team]"), Object.keys(teams));
}

function deadTable(dead) {
  table(document.getElementById("dead"), ["time", "reason", "error", "role", "source", "dlq offset", "bytes"],
    dead.map((d) => [`${new Date(d.t * 1000).toLocaleTimeString()} (+${(d.t - t0()).toFixed(0)} s)`, d.reason,
      d.error_type, d.role, `${d.source_topic}[${d.source_partition}]@${d.source_offset}`, String(d.dlq_offset),
      String(d.bytes)]));
}

// ---- the live stream ---------------------------------------------------------------------------
function apply(msg) {
  const started = performance.now();
  const touched = new Set();
  let points = 0, timeMoved = false;
  for (const [key, l] of Object.entries(msg.lines || {})) {
    if (l.reset) store.lines[key] = { chart: l.chart, x: l.x, label: l.label, points: l.points };
    else if (store.lines[key]) for (const p of l.append) store.lines[key].points.push(p);
    else continue;
    points += (l.points || l.append).length;
    touched.add(store.lines[key].chart);
    timeMoved = timeMoved || isTime(store.lines[key]);
  }
  if (msg.tables) {
    Object.assign(store.tables, msg.tables);
    if ("t0" in msg.tables) timeMoved = true;
    drawTables(store.tables);
  }
  document.getElementById("nocharts").hidden = msg.charts !== false;
  if (timeMoved) for (const [n, d] of Object.entries(LINE_CHARTS)) if (d.xTitle === TIME) touched.add(n);
  for (const name of touched) drawLines(name);
  window.dashboardPerf.push({ points, charts: touched.size, ms: performance.now() - started });
  if (window.dashboardPerf.length > 200) window.dashboardPerf.shift();
  const seen = store.tables.groups_seen;
  if ((seen !== groupsSeen && follow()) || (tokenizerPending && store.tables.tokenizer)) {
    groupsSeen = seen;  // new groups, or the tokenizer loaded: text instead of ids
    loadGroups();
  }
}

let connected = false, ended = false;
function setBadge() {
  const live = document.getElementById("live"), f = store.tables.finished;
  if (f && ended) { live.className = "finished"; live.textContent = "finished · this page's server has stopped"; }
  else if (f) { live.className = "finished"; live.textContent = "finished"; }
  else if (connected) { live.className = "on"; live.textContent = "live"; }
  else { live.className = "off"; live.textContent = "reconnecting"; }
}

function connect() {
  const es = new EventSource("/api/events");
  es.addEventListener("update", (e) => {
    window.dashboardStats.messages += 1;
    window.dashboardStats.bytes += e.data.length;
    connected = true;
    apply(JSON.parse(e.data));
    setBadge();
  });
  es.onerror = () => {
    connected = false;
    if (store.tables.finished) { ended = true; es.close(); }  // a finished run's server went: nothing to wait for
    setBadge();  // otherwise EventSource reconnects by itself, and the server sends everything again
  };
}

// ---- the trajectory viewer -----------------------------------------------------------------------
let groupsSeen = -1, tokenizerPending = false, request = null, requestSeq = 0;
const pages = [null];  // the `before` cursor of each page seen; the last is the one shown
const follow = () => pages.length === 1 && document.querySelector("#filters [name=follow]").checked;

function span(cls, text, title) {
  const s = document.createElement("span");
  s.className = cls; s.textContent = text; if (title) s.title = title;
  return s;
}

async function loadGroups() {
  const q = new URLSearchParams();
  for (const el of document.getElementById("filters").elements) {
    if (el.name && el.type !== "checkbox" && el.value) q.set(el.name, el.value);
  }
  const before = pages[pages.length - 1];
  if (before !== null) q.set("before", before);
  if (request) request.abort();  // only the latest query's answer is ever drawn
  const seq = ++requestSeq, ctl = request = new AbortController();
  let res;
  try {
    res = await (await fetch("/api/groups?" + q, { signal: ctl.signal })).json();
  } catch (e) {
    if (e.name === "AbortError") return;
    throw e;
  }
  if (seq !== requestSeq) return;
  request = null;
  drawGroups(res, q);
}

function drawGroups(res, q) {
  tokenizerPending = !res.tokenizer;
  document.getElementById("tokinfo").textContent = res.tokenizer ? "" : "(tokenizer not loaded: token ids)";
  options(document.querySelector("#filters [name=team]"), res.teams);
  options(document.querySelector("#filters [name=finish]"), res.finish_reasons);
  const first = (pages.length - 1) * 20;
  document.getElementById("pageinfo").textContent = res.total
    ? `groups ${first + 1}-${first + res.groups.length} of ${res.total} (newest first)` : "no group matches";
  document.getElementById("groups").dataset.query = q.toString();
  document.getElementById("newer").disabled = pages.length === 1;
  const older = document.getElementById("older");
  older.disabled = res.next_before === null;
  older.dataset.next = res.next_before ?? "";
  document.getElementById("groups").replaceChildren(...res.groups.map((g) => {
    const div = document.createElement("div");
    div.className = "group";
    div.dataset.rewardMean = g.reward_mean;
    div.append(span("meta", `${g.team} · task ${g.task_id} · reward mean ${num(g.reward_mean)} · ` +
      `${g.topic}[${g.partition}]@${g.offset}` + (g.answer != null ? ` · answer ${JSON.stringify(g.answer)}` : "") +
      (g.missing ? " · could not be read back from the topic" : "")));
    for (const t of g.trajectories) {
      const d = document.createElement("div");
      d.className = "traj";
      const comps = Object.entries(t.components).map(([k, v]) => `${k} ${num(v)}`).join(", ");
      d.append(span("nums", `reward ${num(t.reward)}${comps ? " (" + comps + ")" : ""} · advantage ${num(t.advantage)} · ` +
        `v${t.version} · staleness ${t.staleness ?? "-"} · ${t.tokens} tokens, ${t.masked} masked · ${t.finish_reason}`));
      const tok = document.createElement("div");
      tok.className = "tokens";
      for (const im of t.images || []) {  // the pictures the prompt shows, fetched by their sha256
        const img = document.createElement("img");
        img.className = "picture";
        img.src = "/api/media/" + im.sha256;
        img.alt = img.title = `image ${im.width}x${im.height} ${im.mime} sha256 ${im.sha256.slice(0, 12)}`;
        tok.append(img);
      }
      tok.append(span("prompt", t.prompt, "prompt"));
      t.turns.forEach((u, i) => tok.append(span("turn " + (u.trained ? "trained" : "masked"), u.text,
        `turn ${i + 1}: ${u.tokens} tokens, ${u.trained ? "trained (loss_mask 1)" : "masked (loss_mask 0)"}`)));
      d.append(tok);
      div.append(d);
    }
    return div;
  }));
}

document.getElementById("filters").addEventListener("input", () => { pages.length = 1; loadGroups(); });
document.getElementById("filters").addEventListener("submit", (e) => e.preventDefault());
document.getElementById("older").onclick = (e) => { pages.push(+e.target.dataset.next); loadGroups(); };
document.getElementById("newer").onclick = () => { if (pages.length > 1) { pages.pop(); loadGroups(); } };
addChartTools();
connect();
loadGroups();
