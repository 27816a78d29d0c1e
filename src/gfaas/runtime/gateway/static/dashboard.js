// The gfaas dashboard: live state from /v1/dashboard/stream (server-sent events), results from
// /v1/results, deploys through POST /v1/workflows with the gateway's token. No framework, no build.
"use strict";

const $ = (sel) => document.querySelector(sel);
const PARTS = ["queue", "host_pass", "fn_pass", "compute"];
const HISTORY = 120; // points of the rate chart (one per update)
const history = { t: [], series: new Map() }; // workflow -> rates, aligned with t
let chart = null;
let chartNames = "";

function esc(v) {
  return String(v).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function fmt(v, digits = 1) {
  if (v === null || v === undefined) return "-";
  if (typeof v !== "number") return esc(v);
  return v >= 1000 ? Math.round(v).toLocaleString("en") : v.toFixed(digits);
}
function bytes(n) {
  if (n === null || n === undefined) return "-";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}
function token() { return sessionStorage.getItem("gfaas-token") || ""; }
function authHeaders() { const t = token(); return t ? { authorization: `Bearer ${t}` } : {}; }

// -- tabs
function showTab(name) {
  for (const s of document.querySelectorAll("main > section")) s.hidden = s.id !== `tab-${name}`;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.tab === name);
  if (name === "results") loadResults();
}
window.addEventListener("hashchange", () => showTab(location.hash.slice(1) || "overview"));

// -- live state
function setConn(text, cls) { const c = $("#conn"); c.textContent = text; c.className = `conn ${cls}`; }

function render(state) {
  const wfs = state.workflows || [];
  $("#c-workflows").textContent = wfs.length;
  $("#c-rate").textContent = fmt(wfs.reduce((a, w) => a + (w.rate_per_s || 0), 0));
  const p99s = wfs.map((w) => w.p99_ms).filter((x) => x !== null && x !== undefined);
  $("#c-p99").textContent = p99s.length ? fmt(Math.max(...p99s)) : "-";
  $("#c-pending").textContent = state.gateway ? state.gateway.pending : "-";
  $("#c-dedup").textContent = state.dedup ? bytes(state.dedup.saved_bytes) : "-";
  $("#c-dedup-label").textContent = state.dedup && state.dedup.mode
    ? `memory saved by page merging (${state.dedup.mode})` : "memory workers share (RSS - PSS)";
  renderWorkflows(wfs);
  renderChart(state.t, wfs);
  renderNodes(state.nodes || [], state.nodes_note);
  renderScaling(wfs, state.dedup);
  setConn(`live, ${new Date(state.t * 1000).toLocaleTimeString()}`, "live");
}

function breakdownBar(b) {
  if (!b) return '<span class="hint">no successful invocation in the last minute</span>';
  const total = PARTS.reduce((a, k) => a + (b[k] || 0), 0) || 1;
  const spans = PARTS.map((k) => `<span class="${k}" style="width:${(100 * (b[k] || 0)) / total}%" ` +
    `title="${k}: ${fmt(b[k], 2)} ms"></span>`).join("");
  return `<div class="bar" title="total ${fmt(b.total, 2)} ms">${spans}</div>`;
}

function renderWorkflows(wfs) {
  $("#no-workflows").hidden = wfs.length > 0;
  $("#workflows tbody").innerHTML = wfs.map((w) => {
    const fns = Object.values(w.functions || {});
    const sum = (k) => fns.reduce((a, f) => a + (f[k] || 0), 0);
    const adm = w.admission ? `${fmt(w.admission.limit)} / ${w.admission.in_flight} / ${w.admission.waiting}` : "-";
    return `<tr data-workflow="${esc(w.name)}"><td>${esc(w.name)}</td><td class="num">${fmt(w.version, 0)}</td>` +
      `<td class="num rate">${fmt(w.rate_per_s, 2)}</td><td class="num done">${w.done}</td><td class="num">${w.failed}</td>` +
      `<td class="num">${fmt(w.p50_ms, 2)}</td><td class="num">${fmt(w.p99_ms, 2)}</td>` +
      `<td>${breakdownBar(w.breakdown_ms)}</td><td>${adm}</td>` +
      `<td>${sum("warm")} / ${sum("busy")} / ${sum("starting")}</td></tr>`;
  }).join("");
}

function renderChart(t, wfs) {
  history.t.push(t);
  for (const w of wfs) if (!history.series.has(w.name)) history.series.set(w.name, new Array(history.t.length - 1).fill(null));
  for (const [name, xs] of history.series) {
    const w = wfs.find((x) => x.name === name);
    xs.push(w ? w.rate_per_s : null);
  }
  if (history.t.length > HISTORY) { history.t.shift(); for (const xs of history.series.values()) xs.shift(); }
  const names = [...history.series.keys()];
  const data = [history.t, ...names.map((n) => history.series.get(n))];
  const el = $("#chart-rate");
  if (!chart || chartNames !== names.join()) {
    if (chart) chart.destroy();
    const colors = ["#2563eb", "#10b981", "#f59e0b", "#8b5cf6", "#ef4444", "#0ea5e9", "#84cc16"];
    chart = new uPlot({
      width: Math.max(400, el.clientWidth - 12), height: 220,
      series: [{}, ...names.map((n, i) => ({ label: n, stroke: colors[i % colors.length], width: 2 }))],
      axes: [{}, { label: "per s" }], scales: { x: { time: true } },
    }, data, el);
    chartNames = names.join();
  } else {
    chart.setData(data);
  }
}

function tiersOf(node) {
  const t = node.tiers || {};
  return Array.isArray(t) ? t.map((x) => [x.name || x.tier, x]) : Object.entries(t);
}

const lastLinks = new Map(); // node -> {t, links}: bytes per second from the change since the last update

function linkRates(n) {
  const now = n.time || Date.now() / 1000;
  const prev = lastLinks.get(n.node_id);
  const rates = {};
  for (const [k, v] of Object.entries(n.links || {})) {
    rates[k] = prev && now > prev.t && prev.links[k] !== undefined ? Math.max(0, (v - prev.links[k]) / (now - prev.t)) : 0;
  }
  lastLinks.set(n.node_id, { t: now, links: { ...(n.links || {}) } });
  return rates;
}

// The node's topology: host, disk, each GPU and the network, edges drawn by what the links moved.
function topology(n, rates) {
  const gpus = tiersOf(n).map(([name]) => name).filter((x) => /^gpu\d+$/.test(x));
  const pos = { host: [260, 90], disk: [60, 90], net: [460, 90] };
  gpus.forEach((g, i) => { pos[g] = [120 + i * (300 / Math.max(1, gpus.length - 1 || 1)), 200]; });
  const edges = [];
  for (const [k, rate] of Object.entries(rates)) {
    let m;
    if (k === "disk-write") edges.push(["host", "disk", k, rate]);
    else if (k === "disk-read") edges.push(["disk", "host", k, rate]);
    else if (k === "net-in") edges.push(["net", "host", k, rate]);
    else if (k === "net-out") edges.push(["host", "net", k, rate]);
    else if ((m = /^h2d:(gpu\d+)$/.exec(k))) edges.push(["host", m[1], k, rate]);
    else if ((m = /^d2h:(gpu\d+)$/.exec(k))) edges.push([m[1], "host", k, rate]);
    else if ((m = /^peer:(gpu\d+)->(gpu\d+)$/.exec(k))) edges.push([m[1], m[2], k, rate]);
  }
  const lines = edges.filter(([a, b]) => pos[a] && pos[b]).map(([a, b, k, rate], i) => {
    const [x1, y1] = pos[a], [x2, y2] = pos[b];
    const w = rate > 0 ? Math.min(8, 1 + Math.log10(1 + rate / 1e6) * 2) : 1;
    const off = (i % 2 ? 8 : -8);
    return `<line x1="${x1}" y1="${y1 + off}" x2="${x2}" y2="${y2 + off}" stroke="${rate > 0 ? "#2563eb" : "#cbd5e1"}" stroke-width="${w}"></line>` +
      `<text x="${(x1 + x2) / 2}" y="${(y1 + y2) / 2 + off - 3}" class="edge">${esc(k)} ${bytes(rate)}/s</text>`;
  }).join("");
  const boxes = Object.entries(pos).map(([name, [x, y]]) =>
    `<g><rect x="${x - 38}" y="${y - 16}" width="76" height="32" rx="5" class="box"></rect>` +
    `<text x="${x}" y="${y + 5}" text-anchor="middle">${esc(name)}</text></g>`).join("");
  return `<svg class="topology" viewBox="0 0 520 240" width="520" height="240">${lines}${boxes}</svg>`;
}

function renderNodes(nodes, note) {
  $("#nodes-note").hidden = !note;
  $("#nodes-note").textContent = note || "";
  $("#nodes").innerHTML = nodes.map((n) => {
    const tiers = tiersOf(n).map(([name, x]) => {
      const cap = x.capacity_bytes || Math.max(x.bytes_live || 0, x.bytes_reserved || 0, x.bytes_target || 0, 1);
      const pct = (v) => `${Math.min(100, (100 * (v || 0)) / cap)}%`;
      return `<div class="tier"><b>${esc(name)}</b><div class="meter" title="live ${bytes(x.bytes_live)}, reserved ` +
        `${bytes(x.bytes_reserved)}, target ${bytes(x.bytes_target)}, capacity ${x.capacity_bytes ? bytes(x.capacity_bytes) : "none"}">` +
        `<div class="reserved" style="left:0;width:${pct(x.bytes_reserved)}"></div>` +
        `<div class="live" style="width:${pct(x.bytes_live)}"></div>` +
        (x.bytes_target ? `<div class="target" style="left:${pct(x.bytes_target)}"></div>` : "") +
        `</div><span>${bytes(x.bytes_live)} live, ${bytes(x.bytes_reserved)} reserved` +
        `${x.capacity_bytes ? ` of ${bytes(x.capacity_bytes)}` : ""}, ${fmt(x.objects, 0)} objects</span></div>`;
    }).join("");
    const rates = linkRates(n);
    const links = Object.entries(n.links || {}).map(([k, v]) =>
      `<tr><td>${esc(k)}</td><td class="num">${bytes(v)}</td><td class="num">${bytes(rates[k] || 0)}/s</td></tr>`).join("");
    const counters = Object.entries(n.counters || {}).filter(([, v]) => typeof v === "number")
      .map(([k, v]) => `<tr><td>${esc(k)}</td><td class="num">${fmt(v, 0)}</td></tr>`).join("");
    return `<div class="node"><h3>${esc(n.node || n.node_id || "node")}</h3>${tiers}` +
      `<h4>Topology and link use</h4>${topology(n, rates)}` +
      (links ? `<h4>Bytes moved per link</h4><table><thead><tr><th>link</th><th>in all</th><th>now</th></tr></thead>${links}</table>` : "") +
      `<h4>Counters</h4><table>${counters}</table></div>`;
  }).join("");
}

function startCell(ph) {
  // A worker start's median milliseconds, request to ready; its phases (fork, model, drop, import) on hover.
  if (!ph || ph.ready === undefined) return `<td class="num">-</td>`;
  const parts = Object.entries(ph).filter(([k]) => k !== "ready").map(([k, v]) => `${k} ${fmt(v, 1)}`).join(", ");
  return `<td class="num" title="${esc(parts)}">${fmt(ph.ready, 1)}</td>`;
}

function renderScaling(wfs, dedup) {
  const rows = [];
  for (const w of wfs) {
    for (const [fn, c] of Object.entries(w.functions || {})) {
      const m = c.memory || {};
      rows.push(`<tr><td>${esc(w.name)}</td><td>${esc(fn)}</td>` +
        ["warm", "idle", "busy", "starting", "queue_depth", "cold_starts"].map((k) => `<td class="num">${fmt(c[k], 0)}</td>`).join("") +
        startCell(c.start_ms_p50) +
        `<td class="num">${bytes(m.rss_bytes)}</td><td class="num">${bytes(m.pss_bytes)}</td></tr>`);
    }
  }
  $("#scaling tbody").innerHTML = rows.join("");
  if (!dedup) { $("#dedup").textContent = "-"; return; }
  const base = `Warm workers: ${dedup.processes} processes, ${bytes(dedup.rss_bytes)} resident (RSS), ` +
    `${bytes(dedup.pss_bytes)} proportional (PSS: a shared page counted once in all).`;
  $("#dedup").textContent = dedup.mode
    ? `${base} Page merging (${dedup.mode}) saves ${bytes(dedup.saved_bytes)}: ${bytes(dedup.shared_saved_bytes)} ` +
      `of shared weights, ${bytes(dedup.merged_saved_bytes)} merged by KSM.`
    : `${base} Page merging is off; RSS - PSS (${bytes(dedup.saved_bytes)}) is what the workers share anyway ` +
      "(libraries, copy-on-write pages).";
}

let polling = null;
function poll() {
  if (polling) return;
  setConn("polling", "");
  polling = setInterval(async () => {
    try {
      const r = await fetch("/v1/dashboard/state", { headers: authHeaders() });
      if (!r.ok) { setConn(`error ${r.status}: enter the token on the Deploy tab`, "error"); return; }
      render(await r.json());
    } catch (e) { setConn("gateway unreachable", "error"); }
  }, 1000);
}

function connect() {
  const es = new EventSource("/v1/dashboard/stream");
  es.onmessage = (ev) => render(JSON.parse(ev.data));
  es.onerror = () => { es.close(); poll(); }; // a token is needed (not this user on loopback), or the gateway left
}

// -- results browser
let resultsLoaded = false;
async function loadResults() {
  if (resultsLoaded) return;
  const r = await fetch("/v1/results", { headers: authHeaders() });
  if (!r.ok) { $("#results tbody").innerHTML = `<tr><td colspan="4" class="bad">${r.status}</td></tr>`; return; }
  const list = await r.json();
  resultsLoaded = true;
  $("#results tbody").innerHTML = list.map((e) => `<tr class="clickable" data-id="${esc(e.id)}"><td>${esc(e.id)}</td>` +
    `<td><code>${esc((e.commit || "-").slice(0, 7))}</code>${e.dirty ? " (dirty)" : ""}</td><td>${esc(e.utc || "-")}</td>` +
    `<td>${esc(e.kind || "-")}</td></tr>`).join("") || '<tr><td colspan="4" class="empty">no result files found</td></tr>';
  for (const tr of document.querySelectorAll("#results tr.clickable")) {
    tr.addEventListener("click", () => showResult(list.find((e) => e.id === tr.dataset.id)));
  }
}

function table(rows, limit = 200) {
  if (!rows || !rows.length) return "";
  const cols = [...new Set(rows.slice(0, limit).flatMap((r) => Object.keys(r)))].filter((c) => typeof rows[0][c] !== "object" || rows[0][c] === null);
  const body = rows.slice(0, limit).map((r) => `<tr>${cols.map((c) => `<td>${fmt(r[c], 3)}</td>`).join("")}</tr>`).join("");
  const more = rows.length > limit ? `<p class="hint">${rows.length - limit} more rows in the file.</p>` : "";
  return `<table><thead><tr>${cols.map((c) => `<th>${esc(c)}</th>`).join("")}</tr></thead><tbody>${body}</tbody></table>${more}`;
}

function paperTable(items) {
  if (!items || !items.length) return "";
  return "<table><thead><tr><th>metric</th><th>paper</th><th>ours</th><th>unit</th><th>within tolerance</th></tr></thead><tbody>" +
    items.map((p) => `<tr><td>${esc(p.metric)}</td><td class="num">${fmt(p.paper, 2)}</td><td class="num">${fmt(p.ours, 2)}</td>` +
      `<td>${esc(p.unit || "")}</td><td class="${p.within_tolerance ? "ok" : "bad"}">${p.within_tolerance ? "yes" : "no"}</td></tr>`).join("") +
    "</tbody></table>";
}

async function showResult(entry) {
  const out = $("#result");
  out.innerHTML = `<h2>${esc(entry.id)}</h2><p class="hint">loading...</p>`;
  const r = await fetch(`/v1/results/${entry.id.split("/").map(encodeURIComponent).join("/")}`, { headers: authHeaders() });
  if (!r.ok) { out.innerHTML += `<p class="bad">${r.status}: ${esc(await r.text())}</p>`; return; }
  const doc = await r.json();
  const prov = doc.provenance || {};
  const m = prov.machine || {};
  let html = `<h2>${esc(entry.id)}</h2><p>commit <code>${esc(prov.commit || "-")}</code>${prov.dirty ? " (dirty tree)" : ""}, ` +
    `${esc(prov.utc || doc.started_utc || "-")}, ${esc(m.cpu_model || "?")} (${esc(m.cores || "?")} CPUs)<br>` +
    `<code>${esc(prov.command || "")}</code></p>`;
  if (entry.figure) html += `<img class="figure" alt="figure of ${esc(entry.id)}" src="/v1/results/${entry.id.split("/").map(encodeURIComponent).join("/")}/figure">`;
  if (Array.isArray(doc.targets)) html += "<h3>Targets</h3>" + table(doc.targets);
  if (Array.isArray(doc.experiments)) {
    for (const e of doc.experiments) {
      html += `<h3>${esc(e.title || e.experiment)}</h3>` + paperTable(e.paper) + (e.notes ? `<p class="hint">${esc(e.notes)}</p>` : "") + table(e.rows, 40);
    }
  }
  if (Array.isArray(doc.rows)) html += "<h3>Rows</h3>" + table(doc.rows);
  if (doc.gpu && Array.isArray(doc.gpu.rows)) html += "<h3>GPU rows</h3>" + table(doc.gpu.rows) + table(doc.gpu.targets);
  out.innerHTML = html;
}

// -- deploy
async function deploy() {
  const t = $("#token").value.trim();
  if (t) sessionStorage.setItem("gfaas-token", t);
  const out = $("#deploy-out");
  out.textContent = "deploying...";
  const r = await fetch("/v1/workflows", { method: "POST", headers: { "content-type": "application/yaml", ...authHeaders() }, body: $("#spec").value });
  const text = await r.text();
  out.className = r.ok ? "ok" : "bad";
  out.textContent = `${r.status} ${text}`;
}

document.addEventListener("DOMContentLoaded", () => {
  $("#token").value = token();
  $("#deploy-btn").addEventListener("click", deploy);
  showTab(location.hash.slice(1) || "overview");
  connect();
});
