// The dashboard page: draws /api/events' summaries with Chart.js and fills the trajectory viewer
// from /api/groups. Plain JS, no build step; the chart library is vendored (scripts/install.sh).
"use strict";

const charts = {};
window.dashboardCharts = charts;  // for people in the console and for the browser test
const COLORS = ["#1d3557", "#e76f51", "#2a9d8f", "#e9c46a", "#8338ec", "#f4a261", "#457b9d", "#6a994e"];
let t0 = null, groupsSeen = -1, tokenizerPending = true;  // until the server has loaded it

function chart(id, type, xTitle, extra) {
  if (typeof Chart === "undefined") return null;
  if (!charts[id]) {
    const scales = type === "bar" ? {} : { x: { type: "linear", title: { display: !!xTitle, text: xTitle } } };
    charts[id] = new Chart(document.getElementById(id), {
      type, data: { labels: [], datasets: [] },
      options: Object.assign({ animation: false, responsive: true, maintainAspectRatio: false, scales,
        plugins: { legend: { labels: { boxWidth: 10, font: { size: 11 } } } } }, extra || {}) });
  }
  return charts[id];
}

function lines(id, xTitle, series, opts) {
  // series: [{label, points: [[x, y], ...], dots}]
  const c = chart(id, "line", xTitle, opts);
  if (!c) return;
  c.data.datasets = series.map((s, i) => ({
    label: s.label, data: s.points.map(([x, y]) => ({ x, y })), borderColor: COLORS[i % COLORS.length],
    backgroundColor: COLORS[i % COLORS.length], showLine: !s.dots, pointRadius: s.dots ? 2 : 1.5,
    borderWidth: 1.5, stepped: !!s.stepped }));
  c.update();
}

function bars(id, labels, series, opts) {
  const c = chart(id, "bar", null, opts);
  if (!c) return;
  c.data.labels = labels.length ? labels : ["none yet"];  // an empty chart would look broken
  c.data.datasets = series.map((s, i) => ({ label: s.label, data: labels.length ? s.values : [0],
    backgroundColor: COLORS[i % COLORS.length] }));
  c.update();
}

function stepLines(id, series) {
  // series: {names, points: [[t, step, value of names[0], value of names[1], ...]]}: a line per name
  lines(id, "step", series.names.map((n, i) => ({ label: n,
    points: series.points.filter((p) => p[2 + i] !== null).map((p) => [p[1], p[2 + i]]) })));
}

const rel = (t) => +(t - t0).toFixed(1);
const num = (v, d = 3) => (v === null || v === undefined ? "-" : (+v).toFixed(d));

function draw(s) {
  t0 = s.t0 || 0;
  document.getElementById("ns").textContent = s.namespace;
  document.getElementById("nocharts").hidden = s.charts;
  const tr = s.trainer || {};
  document.getElementById("headline").textContent =
    `step ${tr.step ?? "-"} · version ${tr.version ?? "-"} · train reward ${num(tr.reward_mean)} · ` +
    `eval ${s.evals.length ? num(s.evals[s.evals.length - 1][2]) : "-"} · experiences ${s.groups_seen} groups`;

  lines("c-reward-time", "seconds", [
    { label: "train reward (batch mean)", points: s.train.map((p) => [rel(p[0]), p[3]]), dots: true },
    { label: "held-out eval", points: s.evals.map((p) => [rel(p[0]), p[2]]) }]);
  lines("c-reward-version", "version", [
    { label: "train reward", points: s.train.map((p) => [p[2], p[3]]), dots: true },
    { label: "held-out eval", points: s.evals.map((p) => [p[1], p[2]]) }]);
  const st = Object.keys(s.staleness);
  bars("c-staleness", st, [{ label: "trajectories", values: st.map((k) => s.staleness[k]) }]);
  stepLines("c-trainer", s.trainer_timings);
  stepLines("c-offpolicy", s.off_policy);

  const ex = Object.keys(s.explorer_stages);
  const stages = [...new Set(ex.flatMap((e) => Object.keys(s.explorer_stages[e])))];
  bars("c-stages", ex, stages.map((st) => ({ label: st, values: ex.map((e) => s.explorer_stages[e][st] || 0) })),
    { scales: { x: { stacked: true }, y: { stacked: true, max: 1 } } });
  lines("c-streamops", "seconds", Object.entries(s.stream_ops).map(([w, v]) =>
    ({ label: `${w} p50`, points: v.latency.map((p) => [rel(p[0]), p[1]]) })));
  lines("c-versions", "seconds", [
    { label: "published", points: s.published.map((p) => [rel(p[0]), p[1]]), stepped: true },
    ...Object.entries(s.loaded).map(([e, pts]) =>
      ({ label: `${e} loaded`, points: pts.map((p) => [rel(p[0]), p[1]]), stepped: true }))]);
  const lagLabels = [], lagValues = [];
  for (const [g, topics] of Object.entries(s.lag)) for (const [t, n] of Object.entries(topics)) {
    lagLabels.push(`${g.slice(s.namespace.length + 1)} ← ${t.slice(s.namespace.length + 1)}`); lagValues.push(n);
  }
  bars("c-lag", lagLabels, [{ label: "records behind", values: lagValues }], { indexAxis: "y" });
  const dr = Object.keys(s.dead_reasons);
  bars("c-dead", dr, [{ label: "dead letters", values: dr.map((k) => s.dead_reasons[k]) }], { indexAxis: "y" });

  teamsTable(s.teams);
  deadTable(s.dead_letters);
  if ((s.groups_seen !== groupsSeen || tokenizerPending) && document.querySelector("#filters [name=follow]").checked) {
    groupsSeen = s.groups_seen;
    loadGroups();
  }
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

function teamsTable(teams) {
  const cols = ["groups", "trajectories", "reward_mean", "trained_tokens", "masked_tokens", "episodes",
    "prompt_tokens", "completion_tokens", "rejected", "expired", "dead_letters"];
  table(document.getElementById("teams"), ["team", ...cols], Object.entries(teams).map(([t, r]) =>
    [t, ...cols.map((c) => (r[c] === undefined ? "-" : c === "reward_mean" ? num(r[c]) : String(Math.round(r[c]))))]));
  const sel = document.querySelector("#filters [name=team]");
  for (const t of Object.keys(teams)) if (![...sel.options].some((o) => o.value === t)) sel.add(new Option(t, t));
}

function deadTable(dead) {
  table(document.getElementById("dead"), ["reason", "error", "role", "source", "dlq offset", "bytes"],
    dead.map((d) => [d.reason, d.error_type, d.role, `${d.source_topic}[${d.source_partition}]@${d.source_offset}`,
      String(d.dlq_offset), String(d.bytes)]));
}

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
  const res = await (await fetch("/api/groups?" + q)).json();
  tokenizerPending = !res.tokenizer;
  document.getElementById("tokinfo").textContent = res.tokenizer ? "" : "(tokenizer not loaded: token ids)";
  const box = document.getElementById("groups");
  box.replaceChildren(...res.groups.map((g) => {
    const div = document.createElement("div");
    div.className = "group";
    div.append(span("meta", `${g.team} · task ${g.task_id} · reward mean ${num(g.reward_mean)} · ` +
      `${g.topic}[${g.partition}]@${g.offset}` + (g.answer != null ? ` · answer ${JSON.stringify(g.answer)}` : "")));
    for (const t of g.trajectories) {
      const d = document.createElement("div");
      d.className = "traj";
      const comps = Object.entries(t.components).map(([k, v]) => `${k} ${num(v)}`).join(", ");
      d.append(span("nums", `reward ${num(t.reward)}${comps ? " (" + comps + ")" : ""} · advantage ${num(t.advantage)} · ` +
        `v${t.version} · staleness ${t.staleness ?? "-"} · ${t.tokens} tokens, ${t.masked} masked · ${t.finish_reason}`));
      const tok = document.createElement("div");
      tok.className = "tokens";
      tok.append(span("prompt", t.prompt, "prompt"));
      t.turns.forEach((u, i) => tok.append(span("turn " + (u.trained ? "trained" : "masked"), u.text,
        `turn ${i + 1}: ${u.tokens} tokens, ${u.trained ? "trained (loss_mask 1)" : "masked (loss_mask 0)"}`)));
      d.append(tok);
      div.append(d);
    }
    return div;
  }));
}

function connect() {
  const live = document.getElementById("live");
  const es = new EventSource("/api/events");
  es.addEventListener("summary", (e) => { live.className = "on"; live.textContent = "live"; draw(JSON.parse(e.data)); });
  es.onerror = () => { live.className = "off"; live.textContent = "reconnecting"; };  // EventSource retries by itself
}

document.getElementById("filters").addEventListener("input", () => loadGroups());
document.getElementById("filters").addEventListener("submit", (e) => e.preventDefault());
connect();
