// outboxd dashboard: reads the JSON API every second and redraws the
// readiness banner, the rates, the relay and a row per feed (and per
// partition of a Kafka feed); a feed's detail shows its topics, losses and
// dead letters, with the operator's actions on them. Everything from the
// API is put in the page as text (never as HTML). The admin token is kept
// in sessionStorage: for this tab only, until it is closed.
"use strict";

const REFRESH_MS = 1000;
const HISTORY_MS = 5 * 60 * 1000; // sparklines and the rate graph show the last 5 minutes
const RATE_WINDOW_MS = 10 * 1000; // a rate is averaged over 10 s
const SPARK_MIN_SPAN_MS = 60 * 1000;
const DEAD_LETTER_PAGE = 50;
const TOKEN_KEY = "outboxd.adminToken";
const SVG = "http://www.w3.org/2000/svg";

const history = new Map(); // feed name -> [{t, lag, applied}]
const totals = []; // [{t, applied, published}]: every feed's applied, the relay's published
let selected = null; // the feed whose detail is open
let statuses = [];
let pendingAction = null; // what waits for the admin token

const STATE_NOTES = {
  waiting: "waiting for its source",
  stalled: "STALLED: nothing moves; it retries by itself",
  failed: "FAILED: stopped until a restart",
  backpressure: "backpressured: the outbox is full; reading waits for the relay",
  stopped: "not running",
};

function el(tag, props, ...children) {
  const e = document.createElement(tag);
  Object.assign(e, props || {});
  for (const c of children) e.append(c);
  return e;
}

function svgEl(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

async function getJSON(path) {
  const res = await fetch(path, { cache: "no-store", headers: { Accept: "application/json" } });
  if (!res.ok) throw new Error(path + ": HTTP " + res.status);
  return res.json();
}

// readiness reads /readyz, whose 503 answer carries the reasons.
async function readiness() {
  const res = await fetch("/readyz", { cache: "no-store", headers: { Accept: "application/json" } });
  if (res.status !== 200 && res.status !== 503) throw new Error("/readyz: HTTP " + res.status);
  return res.json();
}

function fmtAge(seconds) {
  if (!seconds) return "–";
  if (seconds < 60) return seconds.toFixed(1) + " s";
  const m = Math.floor(seconds / 60);
  if (m < 60) return m + " m " + Math.floor(seconds % 60) + " s";
  return Math.floor(m / 60) + " h " + (m % 60) + " m";
}

function fmtRate(r) {
  if (r === null) return "–";
  return (r >= 10 ? r.toFixed(0) : r.toFixed(1)) + "/s";
}

function fmtTime(s) {
  return s ? new Date(s).toLocaleString() : "";
}

function record(fs, now) {
  let h = history.get(fs.feed);
  if (!h) history.set(fs.feed, (h = []));
  h.push({ t: now, lag: fs.lag, applied: fs.applied });
  while (h.length > 0 && h[0].t < now - HISTORY_MS) h.shift();
  return h;
}

// rate is the growth per second of key over the window ending at the last
// sample.
function rate(h, key, now, window) {
  const last = h[h.length - 1];
  const first = h.find((p) => p.t >= now - window) || h[0];
  if (!last || last.t === first.t) return null;
  return Math.max(last[key] - first[key], 0) / ((last.t - first.t) / 1000);
}

function sparkline(h) {
  const w = 120, ht = 22;
  const svg = svgEl("svg", { class: "spark", width: w, height: ht, viewBox: `0 0 ${w} ${ht}`, "aria-label": "lag over the last minutes" });
  if (h.length > 0) {
    const secs = Math.round((h[h.length - 1].t - h[0].t) / 1000);
    const title = svgEl("title");
    title.textContent = `lag over the last ${secs} s, at most ${Math.max(...h.map((p) => p.lag))}`;
    svg.append(title);
  }
  if (h.length > 1) {
    // The x axis spans the samples kept (at least a minute), newest at the
    // right edge, so a fresh page draws a readable line at once.
    const last = h[h.length - 1].t;
    const span = Math.max(last - h[0].t, SPARK_MIN_SPAN_MS);
    const top = Math.max(1, ...h.map((p) => p.lag));
    const pts = h.map((p) => {
      const x = w - ((last - p.t) / span) * w;
      const y = ht - 1 - (p.lag / top) * (ht - 2);
      return x.toFixed(1) + "," + y.toFixed(1);
    });
    svg.append(svgEl("polyline", { points: pts.join(" ") }));
  }
  return svg;
}

function lossItem(l) {
  const li = el("li", {}, `${fmtTime(l.at)}: ${l.reason} `,
    el("span", { className: "range", textContent: l.extent === "unknown"
      ? `(partition ${l.partition}, from ${l.from}, extent unknown)`
      : `(partition ${l.partition}, ${l.from}–${l.to})` }));
  if (l.ackedAt) {
    li.className = "acked";
    li.append(" — acknowledged");
  }
  return li;
}

// lossCell lists the losses: all of them while the feed is not lossless,
// the unacknowledged ones (none) and a count of the others once it is.
function lossCell(fs) {
  const loss = el("td", { className: "lossless" });
  loss.append(fs.lossless
    ? el("span", { className: "badge lossless", textContent: "lossless" })
    : el("span", { className: "badge lossy", textContent: "NOT LOSSLESS" }));
  if (fs.losses.length > 0) {
    const shown = fs.lossless ? fs.losses.filter((l) => !l.ackedAt) : fs.losses;
    if (shown.length > 0) loss.append(el("ul", { className: "losses" }, ...shown.map(lossItem)));
    const acked = fs.losses.filter((l) => l.ackedAt).length;
    if (fs.lossless && acked > 0) loss.append(el("div", { className: "muted", textContent: `${acked} acknowledged` }));
  }
  if (fs.lossCount > fs.losses.length) {
    loss.append(el("div", { className: "muted", textContent: `${fs.lossCount - fs.losses.length} older losses not listed` }));
  }
  return loss;
}

function stateCell(fs) {
  const state = el("td", { className: "state" }, el("span", { className: "pill state-" + fs.state, textContent: fs.state }));
  if (STATE_NOTES[fs.state]) state.append(el("p", { className: "state-note", textContent: STATE_NOTES[fs.state] }));
  if (fs.lastError) state.append(el("p", { className: "error last-error", textContent: fs.lastError }));
  return state;
}

function feedRow(fs, h, now) {
  const tr = el("tr", { className: `feed feed-${fs.state}` + (fs.lossless ? "" : " lossy-row") });
  tr.dataset.feed = fs.feed;
  tr.dataset.state = fs.state;
  const open = el("button", { type: "button", className: "open-feed", textContent: fs.feed, title: "topics, losses and dead letters" });
  open.dataset.feed = fs.feed;
  tr.append(el("td", { className: "name" },
    el("div", { className: "feed-name" }, open),
    el("div", { className: "feed-source", textContent: `${fs.kind}:${fs.source} → ${fs.processor}` })));
  tr.append(stateCell(fs));
  tr.append(el("td", { className: "position", textContent: `${fs.position} / ${fs.end}` }));
  tr.append(el("td", { className: "lag" }, el("span", { className: "lag-value", textContent: String(fs.lag) }), sparkline(h)));
  tr.append(el("td", { className: "applied" },
    el("div", { className: "applied-total", textContent: String(fs.applied) }),
    el("div", { className: "applied-rate muted", textContent: fmtRate(rate(h, "applied", now, RATE_WINDOW_MS)) })));
  const dl = el("button", { type: "button", className: "link dead-letters", textContent: String(fs.deadLettered) });
  dl.dataset.feed = fs.feed;
  tr.append(el("td", {}, dl));
  tr.append(lossCell(fs));
  tr.append(el("td", { className: "outbox" },
    el("div", { textContent: `${fs.outbox.pending} pending` }),
    el("div", { className: "muted", textContent: fmtAge(fs.outbox.oldestPendingAge) })));
  return tr;
}

// partitionRows are a Kafka feed's partitions, one row each.
function partitionRows(fs) {
  if (fs.kind !== "kafka") return [];
  return fs.partitions.map((p) => {
    const tr = el("tr", { className: "partition-row" });
    tr.dataset.feed = fs.feed;
    tr.dataset.partition = String(p.partition);
    tr.append(el("td", { className: "pname", textContent: `partition ${p.partition}` }),
      el("td", { className: "epoch", textContent: p.epoch }),
      el("td", { className: "position", textContent: `${p.position} / ${p.end}` }),
      el("td", { className: "lag", textContent: String(p.lag) }),
      el("td", { colSpan: 4 }));
    return tr;
  });
}

// fmtBytes writes a byte count for people: 512 B, 3.2 MiB.
function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}

function renderRelay(os) {
  const r = os.relay;
  document.getElementById("relay-mode").textContent = r.mode;
  document.getElementById("relay-state").textContent =
    r.state + (r.mode === "none" ? "" : r.connected ? " (connected)" : " (not connected)") + (r.fenced ? " FENCED" : "");
  document.getElementById("relay-pending").textContent = `${os.pending} rows, ${fmtBytes(os.pendingBytes)}` +
    (os.maxBacklogBytes > 0 ? ` of at most ${fmtBytes(os.maxBacklogBytes)}` : "") +
    (os.maxBacklogRows > 0 ? ` (at most ${os.maxBacklogRows} rows)` : "");
  document.getElementById("relay-age").textContent = fmtAge(os.oldestPendingAge);
  document.getElementById("relay-last").textContent = String(os.lastPublishedId);
  const err = document.getElementById("relay-error");
  err.hidden = !r.lastError;
  err.textContent = r.lastError || "";
}

function renderHealth(rd) {
  const b = document.getElementById("health");
  b.className = "banner " + (rd.ready ? "ready" : "not-ready");
  document.getElementById("health-title").textContent = rd.ready ? "ready" : "NOT READY";
  document.getElementById("health-reasons").replaceChildren(...rd.reasons.map((r) => el("li", { textContent: r })));
}

function renderFeeds(now) {
  const rows = [];
  for (const fs of statuses) {
    rows.push(feedRow(fs, record(fs, now), now), ...partitionRows(fs));
  }
  document.querySelector("#feeds tbody").replaceChildren(...rows);
  document.getElementById("nofeeds").hidden = statuses.length > 0;
  for (const name of history.keys()) {
    if (!statuses.some((fs) => fs.feed === name)) history.delete(name);
  }
}

// renderRates draws the ingest (every feed's applied items) and relay
// (published rows) rates of the last minutes.
function renderRates(os, now) {
  totals.push({ t: now, applied: statuses.reduce((n, fs) => n + fs.applied, 0), published: os.published });
  while (totals.length > 0 && totals[0].t < now - HISTORY_MS) totals.shift();
  document.getElementById("rate-ingest").textContent = fmtRate(rate(totals, "applied", now, RATE_WINDOW_MS));
  document.getElementById("rate-relay").textContent = fmtRate(rate(totals, "published", now, RATE_WINDOW_MS));
  const points = { ingest: [], relay: [] };
  for (let i = 1; i < totals.length; i++) {
    const t = totals[i].t;
    points.ingest.push([t, rate(totals.slice(0, i + 1), "applied", t, 5000) || 0]);
    points.relay.push([t, rate(totals.slice(0, i + 1), "published", t, 5000) || 0]);
  }
  const svg = document.getElementById("rate-graph");
  const w = 720, h = 120, top = Math.max(1, ...points.ingest.map((p) => p[1]), ...points.relay.map((p) => p[1]));
  const span = Math.max(now - (totals[0] ? totals[0].t : now), SPARK_MIN_SPAN_MS);
  const children = [svgEl("line", { x1: 0, y1: h - 1, x2: w, y2: h - 1 })];
  for (const [cls, pts] of Object.entries(points)) {
    if (pts.length < 2) continue;
    const xy = pts.map(([t, v]) => `${(w - ((now - t) / span) * w).toFixed(1)},${(h - 2 - (v / top) * (h - 16)).toFixed(1)}`);
    children.push(svgEl("polyline", { class: cls, points: xy.join(" ") }));
  }
  const label = svgEl("text", { x: 4, y: 11 });
  label.textContent = `max ${fmtRate(top)}`;
  children.push(label);
  svg.replaceChildren(...children);
  document.getElementById("rate-span").textContent = `last ${Math.round(span / 1000)} s`;
}

function setConn(ok, err) {
  const c = document.getElementById("conn");
  c.className = "conn " + (ok ? "ok" : "down");
  c.textContent = ok ? "API reachable" : "API unreachable";
  c.title = ok ? "" : String(err);
}

// --- the detail of a feed -------------------------------------------------

function openDetail(name) {
  selected = name;
  document.getElementById("detail").hidden = false;
  document.getElementById("detail-name").textContent = name;
  renderDetail();
  loadDeadLetters();
}

function renderDetail() {
  if (selected === null) return;
  const fs = statuses.find((s) => s.feed === selected);
  if (!fs) return;
  const note = STATE_NOTES[fs.state] ? ` — ${STATE_NOTES[fs.state]}` : "";
  document.getElementById("detail-state").textContent = `${fs.state}${note}${fs.lastError ? ": " + fs.lastError : ""}`;
  document.getElementById("detail-topics").textContent = fs.topics.length > 0 ? fs.topics.join(", ") : "–";
  const box = document.getElementById("detail-losses");
  const key = JSON.stringify([fs.lossless, fs.losses, fs.lossCount]);
  if (box.dataset.key === key) return; // unchanged: keep the button under the pointer
  box.dataset.key = key;
  const parts = [];
  if (fs.losses.length === 0) parts.push(el("p", { className: "muted", textContent: "No losses." }));
  else parts.push(el("ul", { className: "losses" }, ...fs.losses.map(lossItem)));
  if (!fs.lossless) {
    const ack = el("button", { type: "button", id: "ack-losses", className: "danger", textContent: "acknowledge losses" });
    ack.title = "an operator reviewed these losses: the feed is lossless again, the list stays";
    parts.push(ack);
  }
  box.replaceChildren(...parts);
}

async function loadDeadLetters() {
  const name = selected;
  const msg = document.getElementById("dl-message");
  try {
    const page = await getJSON(`/feeds/${encodeURIComponent(name)}/dead-letters?limit=${DEAD_LETTER_PAGE}`);
    if (name !== selected) return;
    document.querySelector("#dead-letters tbody").replaceChildren(...page.deadLetters.map(deadLetterRow));
    msg.textContent = page.deadLetters.length === 0 ? "No dead letters." : "";
    const more = document.getElementById("dl-more");
    more.hidden = page.next === null;
    more.textContent = `more at /feeds/${name}/dead-letters?after=${page.next}`;
  } catch (err) {
    msg.textContent = "dead letters: " + err.message;
  }
}

function preview(text, encoding, bytes, truncated) {
  const shown = encoding === "base64" ? `(base64) ${text}` : text;
  return truncated ? `${shown}… (${bytes} bytes)` : shown;
}

function deadLetterRow(dl) {
  const tr = el("tr", { className: "dead-letter" + (dl.requeuedAt ? " requeued" : "") });
  tr.dataset.id = String(dl.id);
  const action = el("td", { className: "action" });
  if (dl.requeuedAt) {
    action.append(`requeued ${fmtTime(dl.requeuedAt)}`);
  } else {
    const b = el("button", { type: "button", className: "requeue", textContent: "requeue" });
    b.dataset.id = String(dl.id);
    b.title = "apply it again, once";
    action.append(b);
  }
  tr.append(el("td", { textContent: String(dl.id) }),
    el("td", { className: "reason", textContent: dl.reason }),
    el("td", { className: "dl-error", textContent: dl.error + (dl.errorTruncated ? "…" : "") }),
    el("td", { className: "payload", textContent: preview(dl.payload, dl.payloadEncoding, dl.payloadBytes, dl.payloadTruncated) }),
    el("td", { textContent: String(dl.attempts) }),
    el("td", { textContent: fmtTime(dl.at) }),
    action);
  return tr;
}

// --- operator actions -----------------------------------------------------

function showResult(text, isError) {
  const r = document.getElementById("action-result");
  r.textContent = text;
  r.className = isError ? "error" : "muted";
}

// admin runs an admin request with the tab's token, asking for the token
// first when there is none (or it was refused).
function admin(path, done) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (!token) {
    askToken("Requeueing and acknowledging need the admin token. It is kept for this tab only.", () => admin(path, done));
    return;
  }
  fetch(path, { method: "POST", headers: { Authorization: "Bearer " + token, Accept: "application/json" } })
    .then(async (res) => {
      const body = await res.json().catch(() => ({}));
      if (res.status === 401) {
        sessionStorage.removeItem(TOKEN_KEY);
        askToken("The token was refused: give the admin token again.", () => admin(path, done));
        return;
      }
      if (!res.ok) {
        showResult(`${path}: ${body.error ? body.error.message : "HTTP " + res.status}`, true);
        return;
      }
      done(body);
    })
    .catch((err) => showResult(`${path}: ${err.message}`, true));
}

function askToken(why, then) {
  pendingAction = then;
  document.getElementById("token-why").textContent = why;
  document.getElementById("token").hidden = false;
  document.getElementById("token-input").focus();
}

function useToken() {
  const input = document.getElementById("token-input");
  const token = input.value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  input.value = "";
  document.getElementById("token").hidden = true;
  const then = pendingAction;
  pendingAction = null;
  if (then) then();
}

function requeue(id) {
  const name = selected;
  admin(`/feeds/${encodeURIComponent(name)}/dead-letters/${id}/requeue`, (r) => {
    showResult(r.requeued ? `dead letter ${id} of ${name} requeued` : `dead letter ${id} of ${name}: ${r.message}`, false);
    loadDeadLetters();
  });
}

function ackLosses() {
  const name = selected;
  admin(`/feeds/${encodeURIComponent(name)}/losses/ack`, (r) => {
    showResult(`${r.acked} losses of ${name} acknowledged: lossless again`, false);
  });
}

function onClick(ev) {
  const t = ev.target.closest("button");
  if (!t) return;
  if (t.classList.contains("open-feed") || t.classList.contains("dead-letters")) openDetail(t.dataset.feed);
  else if (t.classList.contains("requeue")) requeue(t.dataset.id);
  else if (t.id === "ack-losses") ackLosses();
  else if (t.id === "dl-reload") loadDeadLetters();
  else if (t.id === "token-use") useToken();
  else if (t.id === "token-cancel") {
    pendingAction = null;
    document.getElementById("token").hidden = true;
  } else if (t.id === "detail-close") {
    selected = null;
    document.getElementById("detail").hidden = true;
  }
}

async function refresh() {
  try {
    const [list, os, rd] = await Promise.all([getJSON("/feeds"), getJSON("/outbox/status"), readiness()]);
    statuses = await Promise.all(
      list.feeds.map((f) => getJSON("/feeds/" + encodeURIComponent(f.feed) + "/status")));
    const now = Date.now();
    renderHealth(rd);
    renderRelay(os);
    renderFeeds(now);
    renderRates(os, now);
    renderDetail();
    document.getElementById("updated").textContent = "updated " + new Date(now).toLocaleTimeString();
    document.body.dataset.refreshed = String(now);
    setConn(true);
  } catch (err) {
    setConn(false, err);
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

document.addEventListener("click", onClick);
document.getElementById("token-input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter") useToken();
});
refresh();
