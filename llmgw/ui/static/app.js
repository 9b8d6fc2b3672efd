// The llmgw dashboard: reads the API with the operator's token and follows the event
// stream. Every value from the server is set as text (never as HTML), so a hostile
// model name or reason cannot inject markup.
"use strict";

const TOKEN_KEY = "llmgw.token";
const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  head: 0,
  placed: 0, // the placement log's last position seen (ids are CATALOG:PLACEMENTS)
  following: false,
  autoscale: null, // the last GET /v1/autoscale, for the catalog page's traffic cells
};

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    tr.appendChild(cell instanceof Node ? wrap(cell) : el("td", cell));
  }
  return tr;
}

function wrap(node) {
  const td = document.createElement("td");
  td.appendChild(node);
  return td;
}

function fill(tableId, rows) {
  const body = document.querySelector(`#${tableId} tbody`);
  body.replaceChildren(...rows);
}

// As `llmgw models` words it (scheduler.resilience.Resilience.describe).
function lostWith(r) {
  const count = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
  if (!r.replicas) return "no replica placed";
  let text = `lost with ${count(r.nodes, "node")}`;
  if (r.spread_by !== null && r.domains !== null) {
    text += `, ${count(r.domains, `${r.spread_by} value`)}`;
  }
  return `${text} (${count(r.replicas, "replica")})`;
}

function showError(message) {
  const p = document.getElementById("error");
  p.textContent = message || "";
  p.hidden = !message;
}

async function api(path, init = {}) {
  const headers = new Headers(init.headers || {});
  if (state.token) headers.set("Authorization", `Bearer ${state.token}`);
  const response = await fetch(path, { ...init, headers });
  if (response.status === 401) {
    document.getElementById("login").hidden = false;
    const body = await response.json().catch(() => ({}));
    document.getElementById("login-why").textContent =
      `${body.detail || "A token is needed to read."} Paste a token issued by ` +
      "`llmgw token new NAME --role reader` (any role can read).";
    throw new Error("unauthenticated");
  }
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error(body.detail || (body.error && body.error.message) || response.statusText);
  }
  return response;
}

async function getJSON(path) {
  return (await api(path)).json();
}

function stateCell(value) {
  if (value === undefined || value === null) return el("span", "-");
  return el("span", value, `state-${value}`);
}

function renderDeclared(declared) {
  // A refused edit of the declared file: the previous catalog keeps running; say where
  // and why, as the server's log and /readyz do.
  const p = document.getElementById("declared");
  const refused = declared && declared.state === "refused" && declared.refusal;
  p.textContent = refused ? `Declared catalog refused: ${declared.refusal.detail}` : "";
  p.hidden = !refused;
}

function renderFleet(fleet) {
  renderDeclared(fleet.declared);
  document.getElementById("position").textContent = `at log position ${fleet.catalog_position}`;
  const hasResilience = fleet.models.some((m) => m.resilience);
  document.querySelectorAll(".resilience").forEach((n) => { n.hidden = !hasResilience; });
  fill("models", fleet.models.map((m) => {
    const tr = row([
      m.name,
      el("span", m.declared ? "declared" : "runtime", "tag"),
      m.wanted, m.placed, m.ready === null ? "-" : m.ready, m.unplaced,
    ]);
    const res = el("td", m.resilience ? lostWith(m.resilience) : "-", "resilience");
    res.hidden = !hasResilience;
    tr.appendChild(res);
    for (const field of TRAFFIC) tr.appendChild(el("td", "-", `traffic ${field}`));
    tr.dataset.model = m.name;
    return tr;
  }));
  if (state.autoscale) renderTraffic(state.autoscale);
  const reasons = [];
  for (const m of fleet.models) {
    for (const u of m.unplaced_reasons) {
      const li = el("li");
      li.appendChild(el("strong", `${m.name}[${u.replica}]`));
      li.appendChild(document.createTextNode(`: ${u.reason}`));
      reasons.push(li);
    }
  }
  // The reasons are the scheduler's last round's (/v1/fleet's reasons_from).
  const waiting = fleet.models.some((m) => m.unplaced > 0);
  const from = fleet.reasons_from;
  if (!reasons.length) {
    reasons.push(el("li", !waiting ? "none: every wanted replica is placed"
      : from && from.unreadable ? `the last round's reasons cannot be read: ${from.unreadable}`
        : "no reasons yet: the scheduler has not planned since (llmgw place --dry-run explains now)"));
  } else if (from && from.planned_at) {
    reasons.push(el("li", `as the scheduler's round at ${from.planned_at} gave them`, "muted"));
  }
  document.getElementById("unplaced").replaceChildren(...reasons);

  const p = fleet.policy;
  document.getElementById("policy").textContent =
    `stale after ${p.stale_after_s}s, lost after a further ${p.grace_s}s`;
  const hasCordon = fleet.nodes.some((n) => n.cordoned !== undefined);
  document.querySelectorAll(".cordon").forEach((n) => { n.hidden = !hasCordon; });
  fill("nodes", fleet.nodes.map((n) => {
    const usable = Math.max(n.gpus - n.gpus_reserved, 0);
    const bar = el("span", null, "bar");
    const inner = el("span");
    inner.style.width = `${usable ? Math.min(100, (100 * n.gpus_used) / usable) : 0}%`;
    bar.appendChild(inner);
    const tr = row([n.name, n.gpu_class || "cpu", `${n.gpus_used} / ${usable}`, bar,
      n.replicas, stateCell(n.state)]);
    const cordon = el("td", n.cordoned ? "cordoned" : "-", "cordon");
    cordon.hidden = !hasCordon;
    tr.appendChild(cordon);
    return tr;
  }));
  // Replica states and endpoints show once the agents report them (older servers: absent).
  const hasEndpoint = fleet.placements.some((p) => p.endpoint);
  document.querySelectorAll(".endpoint").forEach((n) => { n.hidden = !hasEndpoint; });
  fill("placements", fleet.placements.map((p) => {
    const tr = row([p.model, p.replica, p.profile, p.nodes.join(", "), p.gpus_per_node,
      stateCell(p.state)]);
    // Being moved, surge-first (defragmentation or a spread repair): say so, and why.
    if (p.moving) {
      const cell = tr.children[5];
      cell.appendChild(document.createTextNode(" "));
      const tag = el("span", "moving", "tag");
      tag.title = p.moving;
      cell.appendChild(tag);
      cell.appendChild(el("div", p.moving, "muted"));
    }
    const endpoint = el("td", p.endpoint || "-", "endpoint");
    endpoint.hidden = !hasEndpoint;
    tr.appendChild(endpoint);
    return tr;
  }));
}

async function refresh() {
  try {
    const fleet = await getJSON("/v1/fleet");
    renderFleet(fleet);
    // What was just drawn is as of the placement log's head: follow the stream from
    // there. From 0, the first connection replayed the whole log (a burst of redraws).
    state.placed = Math.max(state.placed, fleet.placement_head || 0);
    // The history shows the newest 100 events, the usage ledger's left out unless the
    // page's box asks for them (one a minute per client, model and replica with
    // traffic: they would push every catalog change off the page).
    const usage = document.getElementById("history-usage").checked;
    const page = await getJSON(`/v1/events?newest=100&usage=${usage}`);
    state.head = Math.max(state.head, page.head, fleet.catalog_position || 0);
    renderEvents(page.events);
    await refreshAutoscale();
    document.getElementById("login").hidden = true;
    showError("");
    document.body.dataset.ready = "true";
    return true;
  } catch (err) {
    if (err.message !== "unauthenticated") showError(`cannot read the API: ${err.message}`);
    return false;
  }
}

// TTFT p99 per model over the last refreshes, for the chart against the SLO line.
const HISTORY = 60;
const ttftHistory = new Map();

function chart(samples, slo) {
  const NS = "http://www.w3.org/2000/svg";
  const width = 160, height = 36;
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("width", String(width));
  svg.setAttribute("height", String(height));
  const values = samples.filter((v) => v !== null);
  const top = Math.max(...values, slo || 0, 0.001) * 1.1;
  const y = (v) => (height - (v / top) * height).toFixed(1);
  const line = document.createElementNS(NS, "polyline");
  const step = width / Math.max(HISTORY - 1, 1);
  const points = [];
  samples.forEach((v, i) => { if (v !== null) points.push(`${(i * step).toFixed(1)},${y(v)}`); });
  line.setAttribute("points", points.join(" "));
  svg.appendChild(line);
  if (points.length) {  // the latest p99 as a dot: one sample draws no line
    const [cx, cy] = points[points.length - 1].split(",");
    const dot = document.createElementNS(NS, "circle");
    dot.setAttribute("cx", cx);
    dot.setAttribute("cy", cy);
    dot.setAttribute("r", "2.5");
    svg.appendChild(dot);
  }
  if (slo) {
    const mark = document.createElementNS(NS, "line");
    mark.setAttribute("class", "slo");
    mark.setAttribute("x1", "0");
    mark.setAttribute("x2", String(width));
    mark.setAttribute("y1", y(slo));
    mark.setAttribute("y2", y(slo));
    svg.appendChild(mark);
  }
  const last = values.length ? values[values.length - 1] : null;
  svg.setAttribute("class", `chart${slo && last !== null && last > slo ? " breach" : ""}`);
  return svg;
}

function loadBar(load, capacity, replicas) {
  const wrapEl = el("span");
  const bar = el("span", undefined, "bar");
  const fillEl = el("span");
  const share = load / Math.max(capacity * Math.max(replicas, 1), 0.001);
  fillEl.style.width = `${Math.min(share, 1) * 100}%`;
  bar.appendChild(fillEl);
  wrapEl.appendChild(bar);
  wrapEl.appendChild(el("span", ` ${load.toFixed(2)} / ${capacity} per replica`));
  return wrapEl;
}

// Traffic per model beside its replicas on the catalog page: what the gateways reported
// over the autoscaler's window (GET /v1/autoscale, from the stored signal windows).
const TRAFFIC = ["rate", "inflight", "ttft", "tpot"];

function seconds(value) {
  return value === null || value === undefined ? "-" : `${value.toFixed(3)}s`;
}

function p99Cell(td, value, slo) {
  td.textContent = `${seconds(value)} / ${slo ? `${slo}s` : "none"}`;
  td.classList.toggle("breach", Boolean(slo && value !== null && value > slo));
}

function renderTraffic(data) {
  const span = document.getElementById("traffic-window");
  span.textContent = `(${data.policy.window})`;
  for (const m of data.models) {
    const tr = document.querySelector(`#models tbody tr[data-model="${CSS.escape(m.model)}"]`);
    if (!tr) continue;
    const cell = (field) => tr.querySelector(`td.traffic.${field}`);
    const t = m.traffic;
    if (!t) {
      for (const field of TRAFFIC) {
        cell(field).textContent = "-";
        cell(field).classList.remove("breach");
      }
      continue;
    }
    cell("rate").textContent = t.requests_per_s.toFixed(2);
    cell("inflight").textContent = `${t.inflight.toFixed(2)} (max ${t.inflight_max})`;
    p99Cell(cell("ttft"), t.ttft_p99_s, m.slo.ttft_p99_s);
    p99Cell(cell("tpot"), t.tpot_p99_s, m.slo.tpot_p99_s);
  }
}

function renderAutoscale(data) {
  state.autoscale = data;
  renderTraffic(data);
  const p = data.policy;
  document.getElementById("autoscale-policy").textContent =
    `${p.enabled ? "on" : "off"}: every ${p.interval}, window ${p.window}, target ${p.target}`;
  fill("autoscale", data.models.map((m) => {
    const ttft = m.signals ? m.signals.ttft_p99_s : null;
    const samples = (ttftHistory.get(m.model) || []).concat([ttft]).slice(-HISTORY);
    ttftHistory.set(m.model, samples);
    const last = m.last_decision;
    const tr = row([
      m.model,
      `${m.ready} / ${m.wanted}`,
      `${m.min}..${m.max}`,
      m.autoscaled ? "on" : "off",
      m.signals ? loadBar(m.signals.load, m.capacity, m.ready) : "-",
      chart(samples, m.slo.ttft_p99_s),
      last ? `${last.current} → ${last.wanted}: ${last.reason}` : "-",
    ]);
    tr.dataset.model = m.model;
    return tr;
  }));
}

async function refreshAutoscale() {
  try {
    renderAutoscale(await getJSON("/v1/autoscale"));
  } catch (err) {
    if (err.message !== "unauthenticated") showError(`cannot read the API: ${err.message}`);
  }
}

function renderEvents(events) {
  fill("events", events.slice().reverse().map((e) => row([
    e.position, e.recorded_at, e.type, e.model || "-", e.actor || "-", e.reason || "",
  ])));
  const b = document.getElementById("diff-b");
  if (Number(b.value) === 0) b.value = state.head;
}

async function showDiff(event) {
  event.preventDefault();
  const a = document.getElementById("diff-a").value;
  const b = document.getElementById("diff-b").value;
  const out = document.getElementById("diff");
  try {
    const diff = await getJSON(`/v1/diff?a=${encodeURIComponent(a)}&b=${encodeURIComponent(b)}`);
    const list = el("ul");
    list.id = "diff-lines";
    for (const name of diff.added) list.appendChild(el("li", `+ ${name} added`, "diff-added"));
    for (const name of diff.removed) {
      list.appendChild(el("li", `- ${name} removed`, "diff-removed"));
    }
    for (const c of diff.changed) {
      const li = el("li", `~ ${c.model} changed`, "diff-changed");
      const pre = el("pre", c.changes.map((x) =>
        `${x.path}: ${JSON.stringify(x.before)} -> ${JSON.stringify(x.after)}`).join("\n"));
      li.appendChild(pre);
      list.appendChild(li);
    }
    if (!list.children.length) list.appendChild(el("li", "no change"));
    out.replaceChildren(el("h3", `From position ${diff.from} to ${diff.to}`), list);
  } catch (err) {
    out.replaceChildren(el("p", `diff refused: ${err.message}`, "error"));
  }
}

// Follows /v1/events/stream with fetch (EventSource cannot send a bearer token), with the
// placement events too: a replica placed, moved or ready, a node cordoned, redraws the pages.
// It starts at the placement head /v1/fleet gave, so only what changed since comes.
async function follow() {
  if (state.following) return; // one stream per page
  state.following = true;
  const live = document.getElementById("live");
  for (;;) {
    try {
      const response = await api(
        `/v1/events/stream?after=${state.head}&placements=true&placements_after=${state.placed}`,
      );
      live.textContent = "live";
      live.className = "status live";
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const message = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          const id = /^id:\s*(\d+):(\d+)/m.exec(message);
          if (id) {
            state.head = Math.max(state.head, Number(id[1]));
            state.placed = Math.max(state.placed, Number(id[2]));
            // A gateway's usage counts (every second of traffic): the usage page alone
            // is drawn again, not the whole dashboard.
            if (USAGE_EVENT.test(message)) scheduleUsage();
            else scheduleRefresh();
          }
        }
      }
    } catch (err) {
      if (err.message === "unauthenticated") {
        state.following = false;
        return;
      }
    }
    live.textContent = "reconnecting";
    live.className = "status";
    await new Promise((r) => setTimeout(r, 2000));
  }
}

const USAGE_EVENT = /^data:.*"type":\s*"usage\.recorded"/m;
let usagePending = null;
function scheduleUsage() {
  if (usagePending || location.hash !== "#usage") return;
  usagePending = setTimeout(() => { usagePending = null; refreshUsage(); }, 1000);
}

// The usage ledger (GET /v1/usage) with the page's filters, as `llmgw usage` shows it.
const USAGE_COLUMNS = ["requests", "prompt_tokens", "cached_tokens", "completion_tokens",
  "total_tokens"];

async function refreshUsage() {
  const params = new URLSearchParams();
  for (const [id, key] of [["usage-client", "client"], ["usage-model", "model"],
    ["usage-by", "by"]]) {
    const value = document.getElementById(id).value.trim();
    if (value) params.set(key, value);
  }
  const span = Number(document.getElementById("usage-since").value);
  if (span) params.set("since", new Date(Date.now() - span * 1000).toISOString());
  try {
    renderUsage(await getJSON(`/v1/usage?${params}`));
  } catch (err) {
    if (err.message !== "unauthenticated") showError(`cannot read the usage: ${err.message}`);
  }
}

function renderUsage(data) {
  const keys = data.by;
  const head = document.querySelector("#usage thead tr");
  head.replaceChildren(...[...keys, ...USAGE_COLUMNS, "outcomes"].map((k) =>
    el("th", k.replace("_tokens", "").replace("_", " "))));
  const outcomes = (o) => Object.entries(o).map(([k, v]) => `${k} ${v}`).join(", ");
  const rows = data.groups.map((g) => {
    const tr = row([...keys.map((k) => g[k]), ...USAGE_COLUMNS.map((c) => g[c]),
      outcomes(g.outcomes)]);
    tr.dataset.group = keys.map((k) => g[k]).join("/");
    return tr;
  });
  const total = row(["total", ...keys.slice(1).map(() => ""),
    ...USAGE_COLUMNS.map((c) => data.total[c]), outcomes(data.total.outcomes)]);
  total.className = "total";
  rows.push(total);
  fill("usage", rows);
  document.getElementById("usage-position").textContent =
    `${data.rows} rows (${data.pending || 0} pending, not yet rolled up), ` +
    `as of log position ${data.position}` +
    (data.truncated ? " (more groups than shown)" : "");
  const skipped = document.getElementById("usage-skipped");
  skipped.hidden = !data.skipped_count;
  skipped.textContent = data.skipped_count
    ? `${data.skipped_count} usage event(s) skipped, not summed: ` + data.skipped.map((x) =>
      `${x.position ? `position ${x.position}` : x.event_id}: ${x.reason}`).join("; ")
    : "";
}

let pending = null;
function scheduleRefresh() {
  if (pending) return;
  pending = setTimeout(() => { pending = null; refresh(); }, 200);
}

// A link may carry the token in its fragment (`/ui/#token=...`, or `#nodes&token=...`):
// a browser never sends the fragment to a server, so the token stays out of request
// lines and access logs. It is taken into this tab's session and wiped from the
// address bar and its history entry at once.
function takeTokenFromFragment() {
  const parts = (location.hash || "").replace(/^#/, "").split("&");
  const token = parts.find((p) => p.startsWith("token="));
  if (token === undefined) return;
  state.token = decodeURIComponent(token.slice("token=".length)).trim();
  sessionStorage.setItem(TOKEN_KEY, state.token);
  const page = parts.filter((p) => p && !p.startsWith("token=")).join("&") || "catalog";
  history.replaceState(null, "", `${location.pathname}${location.search}#${page}`);
}

function route() {
  const page = (location.hash || "#catalog").slice(1);
  for (const section of document.querySelectorAll("main > section")) {
    section.hidden = section.id !== `page-${page}`;
  }
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", link.dataset.page === page);
  }
  if (page === "usage") refreshUsage();
}

async function start() {
  takeTokenFromFragment();
  window.addEventListener("hashchange", () => {
    if (location.hash.includes("token=")) {
      takeTokenFromFragment();
      refresh().then((ok) => { if (ok) follow(); });
    }
    route();
  });
  route();
  document.getElementById("diff-form").addEventListener("submit", showDiff);
  document.getElementById("history-usage").addEventListener("change", () => refresh());
  document.getElementById("usage-form").addEventListener("submit", (event) => {
    event.preventDefault();
    refreshUsage();
  });
  document.getElementById("login").addEventListener("submit", async (event) => {
    event.preventDefault();
    state.token = document.getElementById("token").value.trim();
    sessionStorage.setItem(TOKEN_KEY, state.token);
    if (await refresh()) follow();
  });
  if (await refresh()) follow();
  // Node freshness changes with time alone, and placement rounds are not catalog
  // events: look again every 10 s as well.
  // The autoscaling page follows the load more closely than the rest: every 2 s.
  // So does the catalog page's traffic beside each model's replicas.
  setInterval(() => {
    const page = location.hash || "#catalog";
    if ((page === "#autoscale" || page === "#catalog") &&
        document.getElementById("login").hidden) {
      refreshAutoscale();
    }
    // A gateway's flush is a pending row (no event on the stream) until its minute is
    // rolled up: the usage page looks again as often.
    if (page === "#usage" && document.getElementById("login").hidden) refreshUsage();
  }, 2000);
  setInterval(() => {
    if (!document.getElementById("login").hidden) return;
    refresh();
    if (location.hash === "#usage") refreshUsage();
  }, 10000);
}

start();
