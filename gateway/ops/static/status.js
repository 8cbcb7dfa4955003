// The status page: fetch /api/status every second and render it. No framework,
// no build step: plain DOM, text only (names come from clients).
"use strict";

const REFRESH_MS = 1000;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function num(n) {
  if (n === null || n === undefined) return "–";
  if (typeof n === "number" && !Number.isInteger(n)) return n.toFixed(1);
  return String(n);
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(Math.round(n))) + " " + units[i];
}

function ago(seconds) {
  if (seconds < 60) return Math.round(seconds) + "s";
  if (seconds < 3600) return Math.round(seconds / 60) + "m";
  return (seconds / 3600).toFixed(1) + "h";
}

function row(cells, attrs) {
  const tr = el("tr");
  for (const [k, v] of Object.entries(attrs || {})) tr.setAttribute(k, v);
  for (const c of cells) tr.appendChild(c instanceof Node ? c : el("td", c));
  return tr;
}

function numCell(n, cls) { return el("td", num(n), "num" + (cls ? " " + cls : "")); }

function fill(tableId, rows, empty) {
  const body = document.querySelector("#" + tableId + " tbody");
  body.replaceChildren(...rows);
  if (!rows.length) {
    const cols = document.querySelectorAll("#" + tableId + " th").length;
    const td = el("td", empty, "muted");
    td.colSpan = cols;
    body.appendChild(el("tr")).appendChild(td);
  }
}

// Trends: every series is a bounded ring of (time, rate) points kept in the
// page, one point per snapshot, for the last TREND_S seconds. Nothing is kept
// on the gateway: a page opened now starts with an empty chart.
const TREND_S = 300;
const TREND_POINTS = 300;
const SPARK_W = 120;
const SPARK_H = 24;
const SVG_NS = "http://www.w3.org/2000/svg";
const trends = new Map(); // "listeners/ingest/messages_in" → [[time, rate], ...]

function remember(key, time, value) {
  let ring = trends.get(key);
  if (!ring || (ring.length && time < ring[ring.length - 1][0])) {
    ring = []; // new series, or the gateway's clock went back: start over
    trends.set(key, ring);
  }
  if (ring.length && ring[ring.length - 1][0] === time) ring.pop();
  ring.push([time, typeof value === "number" ? value : 0]);
  while (ring.length > TREND_POINTS || ring[0][0] < time - TREND_S) ring.shift();
}

function rememberAll(s) {
  const live = new Set();
  const keep = (section, name, rates) => {
    for (const key of ["messages_in", "messages_out"]) {
      const id = section + "/" + name + "/" + key;
      live.add(id);
      remember(id, s.time, (rates || {})[key]);
    }
  };
  for (const l of s.listeners) keep("listeners", l.name, (s.rates.listeners || {})[l.name]);
  for (const d of s.destinations) keep("destinations", d.name, (s.rates.destinations || {})[d.name]);
  for (const id of trends.keys()) if (!live.has(id)) trends.delete(id); // gone: forget it
}

function describe(what, ring) {
  const values = ring.map((p) => p[1]);
  return what + " now " + num(values[values.length - 1]) +
    " (range " + num(Math.min(...values)) + " to " + num(Math.max(...values)) + ")";
}

// A sparkline of msg/s in (solid) and out (dashed) of one listener or
// destination, on one scale from 0; its text alternative says the current
// value and the range of each line.
function trendCell(section, name) {
  const td = el("td", null, "trend");
  const lines = ["messages_in", "messages_out"]
    .map((key) => [key, trends.get(section + "/" + name + "/" + key) || []])
    .filter(([, ring]) => ring.length);
  if (!lines.length) return td;
  const end = Math.max(...lines.map(([, r]) => r[r.length - 1][0]));
  const start = Math.min(...lines.map(([, r]) => r[0][0]));
  const top = Math.max(1, ...lines.flatMap(([, r]) => r.map((p) => p[1])));
  const svg = document.createElementNS(SVG_NS, "svg");
  svg.setAttribute("viewBox", "0 0 " + SPARK_W + " " + SPARK_H);
  svg.setAttribute("class", "spark");
  svg.setAttribute("role", "img");
  const label = "msg/s " + lines.map(([key, ring]) => describe(key.slice(9), ring)).join(", ") +
    ", over the last " + ago(end - start);
  svg.setAttribute("aria-label", label);
  svg.appendChild(document.createElementNS(SVG_NS, "title")).textContent = label;
  for (const [key, ring] of lines) {
    const line = document.createElementNS(SVG_NS, "polyline");
    line.setAttribute("class", key.slice(9));
    line.setAttribute("points", ring.map(([t, v]) =>
      (SPARK_W * (1 - (end - t) / TREND_S)).toFixed(1) + "," +
      (SPARK_H - 1 - ((SPARK_H - 2) * Math.max(0, v)) / top).toFixed(1)).join(" "));
    svg.appendChild(line);
  }
  td.appendChild(svg);
  return td;
}

function render(s) {
  rememberAll(s);
  const ready = document.getElementById("ready");
  ready.textContent = s.draining ? "draining" : s.ready ? "ready" : "not ready";
  ready.className = "badge " + (s.ready ? "ok" : "bad");
  ready.title = s.not_ready.join("\n");
  document.getElementById("summary").textContent =
    "v" + s.version + " · up " + ago(s.uptime_s) + " · " + s.inflight + " publishes unsettled";
  document.getElementById("updated").textContent =
    "updated " + new Date(s.time * 1000).toLocaleTimeString();

  const hints = document.getElementById("hints");
  hints.replaceChildren(...s.hints.map((h) => {
    const li = el("li", null, h.level);
    li.append(el("b", h.subject + ":"), h.text);
    return li;
  }));
  if (!s.hints.length) hints.appendChild(el("li", "Nothing holds senders' acks right now.", "muted"));

  const m = s.memory;
  const bar = document.getElementById("memory-bar");
  bar.style.width = Math.min(100, (100 * m.used) / m.limit).toFixed(1) + "%";
  bar.className = m.exhausted ? "full" : "";
  document.getElementById("memory").textContent =
    bytes(m.used) + " of " + bytes(m.limit) + " used (peak " + bytes(m.peak) + ")" +
    (m.exhausted ? ": exhausted, publishers wait" : "");

  const lr = s.rates.listeners || {};
  fill("listeners", s.listeners.map((l) => {
    const r = lr[l.name] || {};
    return row([
      l.name, l.protocol, l.addresses.join(" ") || "not bound",
      numCell(l.connections + " / " + l.max_connections, "connections"),
      numCell(r.messages_in), numCell(r.messages_out),
      el("td", bytes(r.bytes_in), "num"), el("td", bytes(r.bytes_out), "num"),
      trendCell("listeners", l.name),
    ], { "data-name": l.name });
  }), "no listeners");

  const ur = s.rates.upstreams || {};
  fill("upstreams", s.upstreams.map((u) => {
    const state = el("td");
    state.appendChild(el("span", u.state, "badge " + (u.state === "connected" ? "ok" : "bad")));
    const detail = u.state === "connected"
      ? "connected for " + ago(u.connected_for_s)
      : (u.last_error || "");
    return row([
      u.name, u.protocol, state, u.connect.join(", "),
      numCell((ur[u.name] || {}).messages_out), el("td", detail, "detail"),
    ], { "data-name": u.name });
  }), "no upstreams");

  const dr = s.rates.destinations || {};
  const drows = [];
  for (const d of s.destinations) {
    drows.push(row([
      el("td", d.name, "name"), d.kind,
      numCell((dr[d.name] || {}).messages_in), numCell((dr[d.name] || {}).messages_out),
      numCell(d.backlog.messages, "backlog"), el("td", bytes(d.backlog.bytes), "num"),
      numCell((dr[d.name] || {}).backlog), numCell(d.groups.reduce((a, g) => a + g.members, 0)),
      el("td", ""), el("td", ""), trendCell("destinations", d.name),
    ], { "data-name": d.name, class: "destination" }));
    for (const g of d.groups) {
      drows.push(row([
        g.anonymous ? "(anonymous)" : g.name,
        g.full ? "full" : g.unmatched ? g.unmatched + " unmatched" : "", el("td", ""), el("td", ""),
        numCell(g.held !== undefined ? g.held : g.behind), el("td", bytes(g.held_bytes), "num"),
        el("td", ""), numCell(g.members, g.members ? "" : "warn"),
        numCell(g.queued), numCell(g.unacked), el("td", ""),
      ], { "data-destination": d.name, "data-group": g.name, class: "group" }));
    }
  }
  fill("destinations", drows, "no destinations yet");
}

async function refresh() {
  try {
    const r = await fetch("/api/status", { cache: "no-store" });
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
  } catch (e) {
    const ready = document.getElementById("ready");
    ready.textContent = "unreachable";
    ready.className = "badge bad";
    document.getElementById("updated").textContent = "cannot reach the gateway: " + e.message;
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

refresh();
