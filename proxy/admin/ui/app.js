// kvpersist dashboard: polls GET /kv/status and /kv/sessions every 2 s and reads the live
// event feed from GET /kv/events. Plain browser JavaScript, no dependencies.
//
// Auth: the page itself is served without the admin token; every data request sends it as
// "Authorization: Bearer". It comes from the login form or from the URL fragment
// (/ui#token=...; a fragment is never sent to the server) and is kept in sessionStorage.
// The event stream is read with fetch() rather than EventSource, which cannot send headers.
"use strict";

const POLL_MS = 2000;
const FEED_MAX = 100;
const HISTORY_MAX = 180;        // plot points (6 minutes at one per poll)
const SESSIONS_PER_SERVER = 200;
const TOKEN_KEY = "kvpersist.adminToken";
const DASH = "\u2014";

const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  history: [],                  // {t, reused, prefilled}
  lastEventId: 0,
  run: 0,                       // bumped to stop the running poll and event loops
};

class AuthError extends Error {}

// ---- small helpers ------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const short = (hash) => (hash ? hash.slice(0, 8) : DASH);
const num = (n) => (n === undefined || n === null ? DASH : Number(n).toLocaleString("en-US"));

function bytes(n) {
  if (n === undefined || n === null) return DASH;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function seconds(s) {
  if (s < 60) return s.toFixed(1) + " s";
  if (s < 3600) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function ago(iso) {
  const t = Date.parse(iso);
  if (!iso || Number.isNaN(t)) return DASH;
  const s = Math.max(0, (Date.now() - t) / 1000);
  if (s < 60) return Math.round(s) + " s ago";
  if (s < 3600) return Math.round(s / 60) + " min ago";
  if (s < 86400) return Math.round(s / 3600) + " h ago";
  return new Date(t).toISOString().slice(0, 10);
}

function clock(iso) {
  const t = new Date(iso);
  return Number.isNaN(t.getTime()) ? "" : t.toTimeString().slice(0, 8);
}

// ---- talking to the daemon ----------------------------------------------------------

function authHeaders() {
  return state.token ? { Authorization: "Bearer " + state.token } : {};
}

async function getJSON(path) {
  const r = await fetch(path, { headers: authHeaders(), cache: "no-store" });
  if (r.status === 401) throw new AuthError("token required");
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

async function sessionsOf(server) {
  const q = "?server=" + encodeURIComponent(server.name) + "&limit=" + SESSIONS_PER_SERVER;
  const page = await getJSON("/kv/sessions" + q);
  return { server: server.name, sessions: page.sessions, more: Boolean(page.next) };
}

// ---- rendering ------------------------------------------------------------------------

function sum(servers, pick) {
  return servers.reduce((acc, s) => acc + (pick(s) || 0), 0);
}

// `raw` (a number) is also kept in data-value, for scripts and tests reading the page.
function card(id, label, raw, format, detail) {
  return el("div", { class: "card", id: id, "data-value": String(raw) },
    el("div", { class: "card-label" }, label),
    el("div", { class: "card-value" }, format(raw)),
    el("div", { class: "card-detail" }, detail || ""));
}

function renderTotals(servers) {
  const st = (pick) => sum(servers, (s) => pick(s.stats));
  const used = sum(servers, (s) => s.snapshots.bytes);
  // retention.maxTotalBytes holds per server; 0 is no limit, so one unlimited server means none.
  const limited = servers.every((s) => s.retention.maxTotalBytes > 0);
  const quota = limited ? sum(servers, (s) => s.retention.maxTotalBytes) : 0;
  const restores = st((x) => x.restores);
  const hits = st((x) => x.restoreHits);
  const disk = card("total-disk", "Disk used", used, bytes,
    quota > 0 ? "of " + bytes(quota) + " quota" : "no quota set");
  if (quota > 0) {
    const bar = el("div", { class: "bar" }, el("span"));
    bar.firstChild.style.width = Math.min(100, (100 * used) / quota).toFixed(1) + "%";
    disk.append(bar);
  }
  document.getElementById("totals").replaceChildren(
    card("total-saved", "Prefill time saved", st((x) => x.prefillSecondsSaved), seconds),
    // stats.reusedTokens: after restores only; a session's row also counts its resident turns.
    card("total-reused", "Reused after restores", st((x) => x.reusedTokens), num,
      num(st((x) => x.prefilledTokens)) + " prefilled"),
    // stats.allResponses: every response's reuse, whatever kept the KV there.
    card("total-reused-all", "Reused, all requests", st((x) => x.allResponses.reusedTokens), num,
      num(st((x) => x.allResponses.bySource.resident)) + " resident, " +
      num(st((x) => x.allResponses.bySource.kept)) + " kept"),
    card("total-restores", "Restores", restores, num,
      num(hits) + " verified, " + num(st((x) => x.restoreFailures)) + " failed"),
    card("total-cold", "Cold starts", st((x) => x.coldStarts), num,
      num(st((x) => x.switches)) + " slot switches"),
    card("total-saves", "Saves", st((x) => x.saves), num,
      num(st((x) => x.saveFailures)) + " failed, " + num(st((x) => x.emptySaves)) + " empty"),
    disk);
}

function renderServers(servers) {
  const blocks = servers.map((s) => {
    const rows = s.slots.map((slot) => el("tr", { "data-slot": String(slot.id) },
      el("td", {}, String(slot.id) + (slot.auxiliary ? " (aux)" : "")),
      el("td", { class: "mono" }, slot.owner || DASH),
      el("td", {}, el("span", { class: "state state-" + slot.state }, slot.state)),
      el("td", {}, slot.leased ? "leased" : "free")));
    const model = (s.backend.model || "").split("/").pop() || DASH;
    return el("div", { class: "server", "data-server": s.name },
      el("div", { class: "server-head" },
        el("strong", {}, s.name),
        el("span", { class: "pill pill-" + s.backend.state }, s.backend.state),
        el("span", { class: "muted" }, model + " \u00b7 " + s.mode + " \u00b7 " +
          s.queue.waiting + " waiting" + (s.enabled ? "" : " \u00b7 persistence off"))),
      el("table", { class: "slots" },
        el("thead", {}, el("tr", {}, el("th", {}, "Slot"), el("th", {}, "Owner"),
          el("th", {}, "State"), el("th", {}, "Lease"))),
        el("tbody", {}, ...rows)));
  });
  document.getElementById("servers").replaceChildren(...blocks);
}

function sessionState(s) {
  if (s.resident) return "resident";
  if (!s.snapshot) return "cold";
  return s.snapshot.state === "ready" ? "saved" : "invalid";
}

// A session's counters (GET /kv/sessions `reuse`): restores, prompt tokens llama-server
// reused on its requests, and the prefill time its restores saved ("paid off").
function reuseCells(s) {
  const r = s.reuse;
  if (!r) return [0, 1, 2].map(() => el("td", { class: "num muted" }, DASH));
  const last = s.lastRestore;
  const lastText = last && last.reused >= 0
    ? "last restore: " + num(last.reused) + " of " + num(last.tokens) + " tokens reused" : "";
  const paid = el("td", { class: "num", title: lastText },
    r.restores ? seconds(r.prefillSecondsSaved) : DASH);
  return [
    el("td", { class: "num" }, num(r.restores)),
    el("td", { class: "num", title: num(r.reusedTokensAfterRestore) + " right after restores" },
      num(r.reusedTokens)),
    paid,
  ];
}

function renderSessions(pages) {
  const rows = [];
  let total = 0;
  let more = false;
  for (const page of pages) {
    more = more || page.more;
    for (const s of page.sessions) {
      total++;
      const st = sessionState(s);
      const snap = s.snapshot;
      const stateCell = el("td", {}, el("span", { class: "state state-" + st }, st));
      if (s.dirty) stateCell.append(el("span", { class: "tag" }, "unsaved"));
      if (snap && snap.invalidReason) stateCell.append(el("span", { class: "tag" }, snap.invalidReason));
      const r = s.reuse || {};
      rows.push(el("tr", { "data-hash": short(s.sessionHash), "data-state": st,
        "data-restores": String(r.restores), "data-reused": String(r.reusedTokens),
        "data-saved-seconds": String(r.prefillSecondsSaved) },
        el("td", { class: "mono", title: s.sessionHash }, short(s.sessionHash)),
        el("td", {}, page.server),
        stateCell,
        el("td", { class: "num" }, snap ? num(snap.tokens) : DASH),
        el("td", { class: "num" }, snap ? bytes(snap.bytes) : DASH),
        el("td", {}, snap ? ago(snap.updatedAt) : DASH),
        // Not tracked per session by the daemon yet.
        el("td", { class: "muted" }, DASH),
        ...reuseCells(s)));
    }
  }
  if (rows.length === 0)
    rows.push(el("tr", {}, el("td", { colSpan: 10, class: "muted" }, "no sessions yet")));
  document.querySelector("#sessions tbody").replaceChildren(...rows);
  document.getElementById("session-count").textContent =
    total + (more ? "+ (first " + SESSIONS_PER_SERVER + " per server)" : "");
}

// What requests show that keeps new conversations from starting warm (GET /kv/status
// `hints`), one line per server and hint, with the setting that fixes it.
function renderHints(servers) {
  const lines = [];
  for (const s of servers)
    for (const h of s.hints || [])
      lines.push(el("p", { "data-hint": h.hint, "data-server": s.name },
        el("strong", {}, s.name + ": "), h.effect + " (" + num(h.requests) + " requests). ",
        el("span", { class: "fix" }, "Fix: " + h.fix)));
  const box = document.getElementById("hints");
  box.replaceChildren(...lines);
  box.hidden = lines.length === 0;
}

function renderPlot() {
  const plot = document.getElementById("plot");
  const W = 640, H = 170, L = 58, R = 10, T = 10, B = 22;
  const pts = state.history;
  const max = Math.max(1, ...pts.map((p) => Math.max(p.reused, p.prefilled)));
  const t0 = pts.length ? pts[0].t : 0;
  const span = Math.max(1, (pts.length ? pts[pts.length - 1].t : 0) - t0);
  const x = (t) => L + ((t - t0) / span) * (W - L - R);
  const y = (v) => H - B - (v / max) * (H - T - B);
  const nodes = [];
  for (const f of [0, 0.5, 1]) {
    nodes.push(svg("line", { x1: L, x2: W - R, y1: y(max * f), y2: y(max * f), class: "grid" }));
    const label = svg("text", { x: L - 6, y: y(max * f) + 4, class: "axis", "text-anchor": "end" });
    label.textContent = Math.round(max * f).toLocaleString("en-US");
    nodes.push(label);
  }
  const when = svg("text", { x: W - R, y: H - 6, class: "axis", "text-anchor": "end" });
  when.textContent = pts.length > 1 ? "last " + seconds(span / 1000) + " (since this page opened)" : "collecting\u2026";
  nodes.push(when);
  for (const key of ["prefilled", "reused"]) {
    const d = pts.map((p) => x(p.t).toFixed(1) + "," + y(p[key]).toFixed(1)).join(" ");
    if (pts.length) nodes.push(svg("polyline", { points: d, class: "line " + key }));
  }
  plot.replaceChildren(...nodes);
}

// ---- the event feed -------------------------------------------------------------------

function transfer(e) {
  return num(e.tokens) + " tokens \u00b7 " + bytes(Number(e.bytes)) + " \u00b7 " + e.ms + " ms";
}

const FEED_KINDS = [
  ["kv.session.save.success", "save", (e) => transfer(e)],
  ["kv.session.save.failed", "fail", (e) => "save failed: " + e.reason],
  ["kv.session.restore.success", "restore", (e) => transfer(e)],
  ["kv.session.restore.failed", "fail", (e) => "restore failed (" + e.code + "), prefilling"],
  ["kv.session.cold", "cold", () => "full prefill"],
  ["kv.snapshot.invalidated", "invalid", (e) => "snapshot invalidated: " + e.reason],
  ["kv.persistence.circuit_open", "breaker", (e) => "circuit open after " + e.failures + " failures (" + e.code + "): persistence paused"],
  ["kv.persistence.circuit_recovered", "breaker", () => "circuit recovered: persistence resumed"],
  ["kv.hint.attribution_header", "hint", (e) => e.effect + "; fix: " + e.fix],
];

function describe(e) {
  const kind = FEED_KINDS.find(([name]) => name === e.event);
  if (kind) return [kind[1], kind[2](e)];
  const skip = new Set(["ts", "level", "event", "session"]);
  const rest = Object.entries(e).filter(([k]) => !skip.has(k)).map(([k, v]) => k + "=" + v);
  return [e.level === "WARN" || e.level === "ERROR" ? "fail" : "info", e.event + " " + rest.join(" ")];
}

function addFeedItem(e) {
  const [kind, text] = describe(e);
  const item = el("li", { class: "feed-" + kind, "data-event": e.event, "data-session": e.session || "" },
    el("time", {}, clock(e.ts)),
    el("span", { class: "kind" }, kind),
    e.session ? el("span", { class: "mono session" }, e.session) : "",
    el("span", { class: "text", title: text }, text));
  const feed = document.getElementById("feed");
  feed.prepend(item);
  while (feed.children.length > FEED_MAX) feed.lastChild.remove();
}

function handleFrame(frame) {
  let data = "";
  for (const line of frame.split("\n")) {
    if (line.startsWith("id: ")) state.lastEventId = Number(line.slice(4)) || state.lastEventId;
    else if (line.startsWith("data: ")) data += line.slice(6);
  }
  if (!data) return;  // a keep-alive comment
  try { addFeedItem(JSON.parse(data)); } catch (_) { /* not an event of ours */ }
}

async function readEvents(run) {
  while (run === state.run) {
    try {
      const headers = authHeaders();
      if (state.lastEventId) headers["Last-Event-ID"] = String(state.lastEventId);
      const r = await fetch("/kv/events", { headers, cache: "no-store" });
      if (r.status === 401) throw new AuthError("token required");
      if (!r.ok || !r.body) throw new Error("events: HTTP " + r.status);
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        for (let i; (i = buf.indexOf("\n\n")) >= 0; buf = buf.slice(i + 2)) handleFrame(buf.slice(0, i));
      }
    } catch (err) {
      if (err instanceof AuthError) return askForToken(run);
    }
    await sleep(POLL_MS);
  }
}

// ---- polling and auth -----------------------------------------------------------------

function setConnected(ok, text) {
  const pill = document.getElementById("conn");
  pill.textContent = text || (ok ? "live" : "disconnected");
  pill.className = "pill " + (ok ? "pill-healthy" : "pill-off");
}

async function pollOnce() {
  const status = await getJSON("/kv/status");
  const pages = await Promise.all(status.servers.map(sessionsOf));
  document.getElementById("version").textContent = "v" + status.version;
  state.history.push({
    t: Date.now(),
    reused: sum(status.servers, (s) => s.stats.reusedTokens),
    prefilled: sum(status.servers, (s) => s.stats.prefilledTokens),
  });
  if (state.history.length > HISTORY_MAX) state.history.shift();
  renderTotals(status.servers);
  renderHints(status.servers);
  renderServers(status.servers);
  renderSessions(pages);
  renderPlot();
}

async function poll(run) {
  while (run === state.run) {
    try {
      await pollOnce();
      setConnected(true);
    } catch (err) {
      if (err instanceof AuthError) return askForToken(run);
      setConnected(false);
    }
    await sleep(POLL_MS);
  }
}

function askForToken(run) {
  if (run !== state.run) return;
  state.run++;
  setConnected(false, "token needed");
  document.getElementById("dash").hidden = true;
  const form = document.getElementById("login");
  form.hidden = false;
  document.getElementById("login-error").textContent =
    state.token ? "That token was refused." : "";
  document.getElementById("token").focus();
}

function start() {
  const run = ++state.run;
  document.getElementById("login").hidden = true;
  document.getElementById("dash").hidden = false;
  poll(run);
  readEvents(run);
}

function tokenFromFragment() {
  const m = location.hash.match(/(?:^#|&)token=([^&]*)/);
  if (!m) return;
  state.token = decodeURIComponent(m[1]);
  sessionStorage.setItem(TOKEN_KEY, state.token);
  history.replaceState(null, "", location.pathname + location.search);
}

document.getElementById("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.token = document.getElementById("token").value.trim();
  sessionStorage.setItem(TOKEN_KEY, state.token);
  start();
});

tokenFromFragment();
start();
