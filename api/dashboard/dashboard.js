// outboxd dashboard: reads GET /status every second and redraws the health
// banner (the server's verdict: the worst thing true now, with what to
// do), the relay and a row per feed (and per partition of a Kafka feed);
// the charts are drawn from the server's own history (GET /history, read
// whole once, then the new samples), so a new tab shows the last minutes
// at once and every rate is the server's. A feed's detail shows its
// topics, lag, losses and dead letters, with the operator's actions. Dead
// letters and the actions need a token, kept in sessionStorage: for this
// tab only, until it is closed. Everything from the API is put in the
// page as text (never as HTML).
"use strict";

const REFRESH_MS = 1000;
const DEAD_LETTER_PAGE = 50;
const TOKEN_KEY = "outboxd.adminToken";
const SVG = "http://www.w3.org/2000/svg";

let hist = null; // the server's history, as GET /history answers, kept up to date
let selected = null; // the feed whose detail is open
let overview = null;
let pendingAction = null; // what waits for the token

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

function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

async function getJSON(path, token) {
  const headers = { Accept: "application/json" };
  if (token) headers.Authorization = "Bearer " + token;
  const res = await fetch(path, { cache: "no-store", headers });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) {
    const err = new Error(body.error ? body.error.message : path + ": HTTP " + res.status);
    err.status = res.status;
    throw err;
  }
  return body;
}

function fmtAge(seconds) {
  if (!seconds) return "–";
  if (seconds < 60) return seconds.toFixed(1) + " s";
  const m = Math.floor(seconds / 60);
  if (m < 60) return m + " m " + Math.floor(seconds % 60) + " s";
  return Math.floor(m / 60) + " h " + (m % 60) + " m";
}

function fmtNum(v) {
  if (v === null || v === undefined) return "–";
  if (v >= 1e9) return (v / 1e9).toFixed(1) + "G";
  if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (v >= 1e4) return (v / 1e3).toFixed(0) + "k";
  return v >= 10 || Number.isInteger(v) ? v.toFixed(0) : v.toFixed(1);
}

// fmtBytes writes a byte count for people: 512 B, 3.2 MiB.
function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}

function fmtTime(s) {
  return s ? new Date(s).toLocaleString() : "";
}

function fmtSpan(ms) {
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  return `${Math.floor(s / 60)} min` + (s % 60 ? ` ${s % 60} s` : "");
}

function unitOf(kind) {
  return kind === "kafka" ? "records" : "bytes";
}

// --- the history ------------------------------------------------------

// loadHistory reads the whole history once, then only the samples after
// the last one held, appending them and dropping those past the span.
async function loadHistory() {
  const since = hist && hist.times.length > 0 ? hist.times[hist.times.length - 1] : 0;
  const h = await getJSON(since ? `/history?since=${since}` : "/history");
  if (!hist || since === 0) {
    hist = h;
    return;
  }
  const append = (dst, src) => { for (const v of src) dst.push(v); };
  append(hist.times, h.times);
  for (const k of Object.keys(hist.relay)) append(hist.relay[k], h.relay[k]);
  for (const fh of h.feeds) {
    let mine = hist.feeds.find((f) => f.feed === fh.feed);
    if (!mine) {
      const n = hist.times.length - h.times.length;
      mine = { feed: fh.feed, kind: fh.kind, lagUnit: fh.lagUnit, appliedPerSecond: Array(n).fill(null),
        deadLetters: Array(n).fill(null), lag: Array(n).fill(null), pending: Array(n).fill(null) };
      hist.feeds.push(mine);
    }
    for (const k of ["appliedPerSecond", "deadLetters", "lag", "pending"]) append(mine[k], fh[k]);
  }
  const last = hist.times[hist.times.length - 1];
  let drop = 0;
  while (drop < hist.times.length && hist.times[drop] < last - hist.spanSeconds * 1000) drop++;
  if (drop > 0) {
    hist.times.splice(0, drop);
    for (const k of Object.keys(hist.relay)) hist.relay[k].splice(0, drop);
    for (const f of hist.feeds) for (const k of ["appliedPerSecond", "deadLetters", "lag", "pending"]) f[k].splice(0, drop);
  }
}

// ingestRates sums every feed's applied rate at each sample.
function ingestRates() {
  return hist.times.map((_, i) => {
    let sum = null;
    for (const f of hist.feeds) if (f.appliedPerSecond[i] !== null) sum = (sum || 0) + f.appliedPerSecond[i];
    return sum;
  });
}

// smoothed is the mean of the last n non-null values of a series.
function smoothed(series, n) {
  const vals = series.filter((v) => v !== null).slice(-n);
  return vals.length === 0 ? null : vals.reduce((a, b) => a + b, 0) / vals.length;
}

// chart draws series over the history's times into svg, with a labelled
// y axis (unit) and time axis (minutes before the last sample).
function chart(svg, series, unit) {
  const W = Number(svg.getAttribute("width")), H = Number(svg.getAttribute("height"));
  const left = 56, right = 24, top = 18, bottom = 22;
  const times = hist ? hist.times : [];
  const kids = [];
  const t1 = times.length > 0 ? times[times.length - 1] : 0;
  const t0 = times.length > 0 ? times[0] : 0;
  const span = Math.max(t1 - t0, 60 * 1000); // at least a minute wide
  let ymax = 0;
  for (const s of series) for (const v of s.values) if (v !== null && v > ymax) ymax = v;
  ymax = ymax > 0 ? niceCeil(ymax) : 1;
  const x = (t) => left + (W - left - right) * (1 - (t1 - t) / span);
  const y = (v) => top + (H - top - bottom) * (1 - v / ymax);
  kids.push(svgEl("line", { class: "axis", x1: left, y1: y(0), x2: W - right, y2: y(0) }));
  kids.push(svgEl("line", { class: "axis", x1: left, y1: top, x2: left, y2: y(0) }));
  for (const v of [0, ymax / 2, ymax]) {
    kids.push(svgEl("text", { class: "tick y", x: left - 4, y: y(v) + 3, "text-anchor": "end" }, fmtNum(v)));
    if (v > 0) kids.push(svgEl("line", { class: "grid", x1: left, y1: y(v), x2: W - right, y2: y(v) }));
  }
  kids.push(svgEl("text", { class: "unit", x: left + 4, y: 12 }, unit));
  const stepMin = span > 10 * 60 * 1000 ? 5 : span > 3 * 60 * 1000 ? 1 : 0.5;
  for (let m = 0; m * 60000 <= span; m += stepMin) {
    const xm = x(t1 - m * 60000);
    kids.push(svgEl("line", { class: "grid", x1: xm, y1: top, x2: xm, y2: y(0) }));
    kids.push(svgEl("text", { class: "tick x", x: xm, y: H - 6, "text-anchor": "middle" }, m === 0 ? "now" : `−${m} min`));
  }
  for (const s of series) {
    const pts = [];
    s.values.forEach((v, i) => { if (v !== null) pts.push(`${x(times[i]).toFixed(1)},${y(v).toFixed(1)}`); });
    if (pts.length >= 2) kids.push(svgEl("polyline", { class: s.cls, points: pts.join(" ") }));
    else if (pts.length === 1) {
      const [px, py] = pts[0].split(",");
      kids.push(svgEl("circle", { class: s.cls, cx: px, cy: py, r: 2 }));
    }
  }
  svg.replaceChildren(...kids);
  svg.dataset.samples = String(times.length);
  const first = series.length > 0 ? series[0].values : [];
  svg.dataset.last = first.length > 0 && first[first.length - 1] !== null ? String(first[first.length - 1]) : "";
  svg.dataset.unit = unit;
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
function niceCeil(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function renderCharts() {
  if (!hist) return;
  const ingest = ingestRates(), relay = hist.relay.publishedPerSecond;
  document.getElementById("rate-ingest").textContent = fmtRate(smoothed(ingest, 5), "items");
  document.getElementById("rate-relay").textContent = fmtRate(smoothed(relay, 5), "rows");
  const span = hist.times.length > 1 ? hist.times[hist.times.length - 1] - hist.times[0] : 0;
  document.getElementById("rate-span").textContent = hist.times.length > 1
    ? `last ${fmtSpan(span)} (the server keeps ${fmtSpan(hist.spanSeconds * 1000)})` : "history starts now";
  chart(document.getElementById("rate-graph"), [{ cls: "ingest", values: ingest }, { cls: "relay", values: relay }], "per second");
  chart(document.getElementById("backlog-graph"), [{ cls: "backlog", values: hist.relay.pending }], "rows waiting");
  if (selected !== null) {
    const fh = hist.feeds.find((f) => f.feed === selected);
    if (fh) chart(document.getElementById("lag-graph"), [{ cls: "lag", values: fh.lag }], `lag (${fh.lagUnit})`);
  }
}

function fmtRate(r, what) {
  return r === null ? "–" : `${fmtNum(r)} ${what}/s`;
}

// sparkline is a feed's lag over the history, in the row.
function sparkline(fs) {
  const w = 120, ht = 22;
  const unit = unitOf(fs.kind);
  const svg = svgEl("svg", { class: "spark", width: w, height: ht, viewBox: `0 0 ${w} ${ht}`, "aria-label": `lag (${unit})` });
  const fh = hist && hist.feeds.find((f) => f.feed === fs.feed);
  if (!fh) return svg;
  const vals = fh.lag, times = hist.times;
  const have = vals.map((v, i) => [times[i], v]).filter(([, v]) => v !== null);
  if (have.length === 0) return svg;
  const span = Math.max(times[times.length - 1] - times[0], 60 * 1000);
  const top = Math.max(1, ...have.map(([, v]) => v));
  svg.append(svgEl("title", {}, `lag (${unit}) over the last ${fmtSpan(times[times.length - 1] - have[0][0])}, at most ${top}`));
  const last = times[times.length - 1];
  const pts = have.map(([t, v]) => `${(w - ((last - t) / span) * w).toFixed(1)},${(ht - 1 - (v / top) * (ht - 2)).toFixed(1)}`);
  if (pts.length > 1) svg.append(svgEl("polyline", { points: pts.join(" ") }));
  return svg;
}

// --- the status -------------------------------------------------------

function lossItem(l) {
  const li = el("li", {}, `${fmtTime(l.at)}: ${l.reason} `,
    el("span", { className: "range", textContent: l.extent === "unknown"
      ? `(partition ${l.partition}, from ${l.from}, extent unknown)`
      : `(partition ${l.partition}, ${l.from}–${l.to})` }));
  if (l.ackedAt) {
    li.className = "acked";
    li.append(` — acknowledged by ${l.ackedBy || "an operator"}${l.ackReason ? ": " + l.ackReason : ""}`);
  }
  return li;
}

function lossCell(fs) {
  const cell = el("td", { className: "lossless" });
  cell.append(fs.lossless
    ? el("span", { className: "badge lossless", textContent: "lossless" })
    : el("span", { className: "badge lossy", textContent: "NOT LOSSLESS" }));
  const open = fs.losses.filter((l) => !l.ackedAt).length;
  if (!fs.lossless) cell.append(el("div", { className: "loss-count", textContent: `${open} loss${open === 1 ? "" : "es"}` }));
  else if (fs.lossCount > 0) cell.append(el("div", { className: "muted", textContent: `${fs.lossCount} acknowledged` }));
  return cell;
}

// lossRow lists a feed's open losses in a row of their own, across the
// table, so the feed's own row keeps its shape.
function lossRow(fs) {
  const open = fs.losses.filter((l) => !l.ackedAt);
  if (fs.lossless || open.length === 0) return [];
  const tr = el("tr", { className: "loss-row" });
  tr.dataset.feed = fs.feed;
  const td = el("td", { colSpan: 8 }, el("strong", { textContent: `${fs.feed} lost input: ` }),
    el("ul", { className: "losses" }, ...open.map(lossItem)));
  if (fs.lossCount > fs.losses.length) {
    td.append(el("div", { className: "muted", textContent: `${fs.lossCount - fs.losses.length} older losses not listed` }));
  }
  tr.append(td);
  return [tr];
}

function stateCell(fs) {
  const state = el("td", { className: "state" }, el("span", { className: "pill state-" + fs.state, textContent: fs.state }));
  if (STATE_NOTES[fs.state]) state.append(el("p", { className: "state-note", textContent: STATE_NOTES[fs.state] }));
  if (fs.lastError) state.append(el("p", { className: "error last-error", textContent: fs.lastError }));
  return state;
}

function appliedRate(name) {
  const fh = hist && hist.feeds.find((f) => f.feed === name);
  return fh ? smoothed(fh.appliedPerSecond, 5) : null;
}

function feedRow(fs) {
  const tr = el("tr", { className: `feed feed-${fs.state}` + (fs.lossless ? "" : " lossy-row") });
  tr.dataset.feed = fs.feed;
  tr.dataset.state = fs.state;
  const open = el("button", { type: "button", className: "open-feed", textContent: fs.feed, title: "topics, lag, losses and dead letters" });
  open.dataset.feed = fs.feed;
  tr.append(el("td", { className: "name" },
    el("div", { className: "feed-name" }, open),
    el("div", { className: "feed-source", textContent: `${fs.kind}:${fs.source} → ${fs.processor}` })));
  tr.append(stateCell(fs));
  tr.append(el("td", { className: "position", textContent: `${fs.position} / ${fs.end}` }));
  tr.append(el("td", { className: "lag" },
    el("span", { className: "lag-value", textContent: `${fs.lag} ${unitOf(fs.kind)}` }), sparkline(fs)));
  tr.append(el("td", { className: "applied" },
    el("div", { className: "applied-total", textContent: String(fs.applied) }),
    el("div", { className: "applied-rate muted", textContent: fmtRate(appliedRate(fs.feed), "items") })));
  const dl = el("button", { type: "button", className: "link dead-letters", textContent: String(fs.deadLettered) });
  dl.dataset.feed = fs.feed;
  const recent = overview.recentDeadLetters.find((d) => d.feed === fs.feed);
  const dlCell = el("td", { className: "dl-count" }, dl);
  if (recent) dlCell.append(el("div", { className: "recent", textContent: `${recent.atLeast ? "≥" : ""}${recent.count} open, last hour` }));
  tr.append(dlCell);
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
      el("td", { className: "lag", textContent: `${p.lag} records` }),
      el("td", { colSpan: 4 }));
    return tr;
  });
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

// renderSinks shows each sink (NATS JetStream, a PostgreSQL table,
// webhooks): its state, its lag behind the outbox and its last error; the
// panel is hidden when none is configured.
function renderSinks(os) {
  const sinks = os.sinks || [];
  document.getElementById("sinks").hidden = sinks.length === 0;
  document.querySelector("#sinks-table tbody").replaceChildren(...sinks.map((k) => {
    const tr = el("tr", { className: "sink-row" });
    tr.dataset.sink = k.name;
    tr.append(el("td", { className: "name", textContent: k.name }),
      el("td", { className: "state " + k.state, textContent: k.state }),
      el("td", { className: "lag", textContent: `${k.lagRows} rows, ${fmtBytes(k.lagBytes)}` }),
      el("td", { className: "error", textContent: k.lastError || "" }));
    return tr;
  }));
}

// renderHealth shows the verdict: its level as the banner's colour, the
// worst condition and what to do, then the others.
function renderHealth(v) {
  const b = document.getElementById("health");
  b.className = "banner " + v.level;
  b.dataset.level = v.level;
  b.dataset.code = v.conditions.length > 0 ? v.conditions[0].code : "ok";
  document.getElementById("health-title").textContent = v.level === "ok" ? "OK" : v.level.toUpperCase();
  document.getElementById("health-message").textContent = v.message;
  document.getElementById("health-action").textContent = v.level === "ok" ? "" : "What to do: " + v.action;
  document.getElementById("health-others").replaceChildren(...v.conditions.slice(1).map((c) =>
    el("li", { className: c.level, textContent: `${c.message} — ${c.action}` })));
}

function renderFeeds() {
  const rows = [];
  for (const fs of overview.feeds) rows.push(feedRow(fs), ...lossRow(fs), ...partitionRows(fs));
  document.querySelector("#feeds tbody").replaceChildren(...rows);
  document.getElementById("nofeeds").hidden = overview.feeds.length > 0;
}

function setConn(ok, err) {
  const c = document.getElementById("conn");
  c.className = "conn " + (ok ? "ok" : "down");
  c.textContent = ok ? "API reachable" : "API unreachable";
  c.title = ok ? "" : String(err);
}

// --- the detail of a feed ---------------------------------------------

function openDetail(name) {
  selected = name;
  document.getElementById("detail").hidden = false;
  document.getElementById("detail-name").textContent = name;
  document.getElementById("dl-edit").hidden = true;
  renderDetail();
  renderCharts();
  loadDeadLetters();
}

function renderDetail() {
  if (selected === null || !overview) return;
  const fs = overview.feeds.find((s) => s.feed === selected);
  if (!fs) return;
  const note = STATE_NOTES[fs.state] ? ` — ${STATE_NOTES[fs.state]}` : "";
  document.getElementById("detail-state").textContent = `${fs.state}${note}${fs.lastError ? ": " + fs.lastError : ""}`;
  document.getElementById("detail-topics").textContent = fs.topics.length > 0 ? fs.topics.join(", ") : "–";
  const box = document.getElementById("detail-losses");
  const key = JSON.stringify([fs.lossless, fs.losses, fs.lossCount]);
  if (box.dataset.key === key) return; // unchanged: keep the form under the pointer
  box.dataset.key = key;
  const parts = [];
  if (fs.losses.length === 0) parts.push(el("p", { className: "muted", textContent: "No losses." }));
  else parts.push(el("ul", { className: "losses" }, ...fs.losses.map(lossItem)));
  if (!fs.lossless) {
    const reason = el("input", { type: "text", id: "ack-reason", placeholder: "why (required): how the lost input was recovered, or why it may stay lost" });
    const ack = el("button", { type: "button", id: "ack-losses", className: "danger", textContent: "acknowledge losses" });
    ack.title = "an operator reviewed these losses: the feed is lossless again, the list stays, with your token's name and the reason";
    parts.push(el("div", { className: "ack" }, reason, ack));
  }
  box.replaceChildren(...parts);
}

async function loadDeadLetters() {
  const name = selected;
  const msg = document.getElementById("dl-message");
  const token = sessionStorage.getItem(TOKEN_KEY);
  const body = document.querySelector("#dead-letters tbody");
  if (!token) {
    body.replaceChildren();
    document.getElementById("dl-reasons").replaceChildren();
    msg.replaceChildren("Dead letters may hold personal data: reading them needs a token (read or admin). ",
      el("button", { type: "button", id: "dl-token", className: "link", textContent: "give a token" }));
    return;
  }
  try {
    const page = await getJSON(`/feeds/${encodeURIComponent(name)}/dead-letters?limit=${DEAD_LETTER_PAGE}`, token);
    if (name !== selected) return;
    body.replaceChildren(...page.deadLetters.map(deadLetterRow));
    msg.textContent = page.deadLetters.length === 0 ? "No dead letters." : "";
    renderReasons(page.deadLetters);
    const more = document.getElementById("dl-more");
    more.hidden = page.next === null;
    more.textContent = `more: ${selected === null ? "" : "outboxd dead-letters list " + name + " --after " + page.next}`;
  } catch (err) {
    if (err.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      askToken("The token was refused: give a token (read or admin) again.", loadDeadLetters);
      return;
    }
    msg.textContent = "dead letters: " + err.message;
  }
}

// renderReasons offers, per reason with open dead letters, to requeue or
// discard them all.
function renderReasons(dls) {
  const open = {};
  for (const dl of dls) if (dl.resolution === "open") open[dl.reason] = (open[dl.reason] || 0) + 1;
  const box = document.getElementById("dl-reasons");
  box.replaceChildren(...Object.entries(open).map(([reason, n]) => {
    const div = el("div", { className: "reason-actions" }, el("span", { textContent: `${n} open ${reason}: ` }));
    const rq = el("button", { type: "button", className: "requeue-reason", textContent: `requeue all ${reason}` });
    const dc = el("button", { type: "button", className: "discard-reason danger", textContent: `discard all ${reason}` });
    rq.dataset.reason = reason;
    dc.dataset.reason = reason;
    div.dataset.reason = reason;
    div.append(rq, " ", dc);
    return div;
  }));
}

function preview(text, encoding, bytes, truncated) {
  const shown = encoding === "base64" ? `(base64) ${text}` : text;
  return truncated ? `${shown}… (${bytes} bytes)` : shown;
}

function deadLetterRow(dl) {
  const tr = el("tr", { className: "dead-letter " + dl.resolution });
  tr.dataset.id = String(dl.id);
  const action = el("td", { className: "action" });
  if (dl.resolution === "requeued") {
    action.append(`requeued ${fmtTime(dl.requeuedAt)}${dl.resolvedBy ? " by " + dl.resolvedBy : ""}${dl.requeueEdited ? " (edited)" : ""}`);
  } else if (dl.resolution === "discarded") {
    action.append(`discarded ${fmtTime(dl.discardedAt)}${dl.resolvedBy ? " by " + dl.resolvedBy : ""}: ${dl.note}`);
  } else {
    const b = (cls, text, title) => {
      const x = el("button", { type: "button", className: cls, textContent: text, title });
      x.dataset.id = String(dl.id);
      return x;
    };
    const edit = b("edit", "edit & requeue", "apply an edited payload instead");
    edit.dataset.payload = dl.payloadEncoding === "utf-8" && !dl.payloadTruncated ? dl.payload : "";
    action.append(b("requeue", "requeue", "apply it again, once"), " ", edit, " ", b("discard danger", "discard", "keep it, marked discarded, with why"));
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

// --- operator actions -------------------------------------------------

function showResult(text, isError) {
  const r = document.getElementById("action-result");
  r.textContent = text;
  r.className = isError ? "error" : "muted";
}

// admin runs an admin request with the tab's token, asking for the token
// first when there is none (or it was refused).
function admin(path, body, done) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (!token) {
    askToken("This needs an admin token. It is kept for this tab only.", () => admin(path, body, done));
    return;
  }
  const headers = { Authorization: "Bearer " + token, Accept: "application/json" };
  if (body) headers["Content-Type"] = "application/json";
  fetch(path, { method: "POST", headers, body: body ? JSON.stringify(body) : undefined })
    .then(async (res) => {
      const answer = await res.json().catch(() => ({}));
      if (res.status === 401) {
        sessionStorage.removeItem(TOKEN_KEY);
        askToken("The token was refused: give the admin token again.", () => admin(path, body, done));
        return;
      }
      if (!res.ok) {
        showResult(`${path}: ${answer.error ? answer.error.message : "HTTP " + res.status}`, true);
        return;
      }
      done(answer);
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

function dlPath(suffix) {
  return `/feeds/${encodeURIComponent(selected)}/dead-letters${suffix}`;
}

function requeue(id, body) {
  const name = selected;
  admin(dlPath(`/${id}/requeue`), body, (r) => {
    showResult(r.requeued ? `dead letter ${id} of ${name} requeued${body ? " with the edited payload" : ""}` : `dead letter ${id} of ${name}: ${r.message}`, false);
    document.getElementById("dl-edit").hidden = true;
    loadDeadLetters();
  });
}

// askNote shows an inline note field in the dead letter's (or reason's)
// row and runs then with its text once given.
function askNote(where, then) {
  let form = where.querySelector(".note-form");
  if (form) {
    const note = form.querySelector("input").value.trim();
    if (note) then(note);
    else form.querySelector("input").focus();
    return;
  }
  form = el("span", { className: "note-form" }, el("input", { type: "text", placeholder: "why (required)" }));
  where.append(form);
  form.querySelector("input").focus();
}

function onClick(ev) {
  const t = ev.target.closest("button");
  if (!t) return;
  if (t.classList.contains("open-feed") || t.classList.contains("dead-letters")) openDetail(t.dataset.feed);
  else if (t.classList.contains("requeue")) requeue(t.dataset.id);
  else if (t.classList.contains("edit")) {
    document.getElementById("dl-edit").hidden = false;
    document.getElementById("dl-edit-id").textContent = t.dataset.id;
    document.getElementById("dl-edit-payload").value = t.dataset.payload;
    document.getElementById("dl-edit-payload").focus();
  } else if (t.id === "dl-edit-apply") {
    const id = document.getElementById("dl-edit-id").textContent;
    requeue(id, { payload: document.getElementById("dl-edit-payload").value, note: document.getElementById("dl-edit-note").value });
  } else if (t.id === "dl-edit-cancel") document.getElementById("dl-edit").hidden = true;
  else if (t.classList.contains("discard")) {
    const id = t.dataset.id, name = selected;
    askNote(t.closest("td"), (note) => admin(dlPath(`/${id}/discard`), { note }, (r) => {
      showResult(`dead letter ${id} of ${name}: ${r.message}`, false);
      loadDeadLetters();
    }));
  } else if (t.classList.contains("requeue-reason")) {
    const reason = t.dataset.reason, name = selected;
    admin(dlPath(`/requeue?reason=${encodeURIComponent(reason)}`), null, (r) => {
      showResult(`${reason} dead letters of ${name}: ${r.requeued} requeued, ${r.failed} failed again` + (r.next !== null ? " (more left: again)" : ""), r.failed > 0);
      loadDeadLetters();
    });
  } else if (t.classList.contains("discard-reason")) {
    const reason = t.dataset.reason, name = selected;
    askNote(t.closest("div"), (note) => admin(dlPath(`/discard?reason=${encodeURIComponent(reason)}`), { note }, (r) => {
      showResult(`${reason} dead letters of ${name}: ${r.discarded} discarded`, false);
      loadDeadLetters();
    }));
  } else if (t.id === "ack-losses") {
    const reason = document.getElementById("ack-reason").value.trim();
    if (!reason) {
      showResult("say why the losses are acknowledged", true);
      document.getElementById("ack-reason").focus();
      return;
    }
    const name = selected;
    admin(`/feeds/${encodeURIComponent(name)}/losses/ack`, { reason }, (r) => {
      showResult(`${r.acked} losses of ${name} acknowledged by ${r.by}: lossless again`, false);
    });
  } else if (t.id === "dl-reload") loadDeadLetters();
  else if (t.id === "dl-token") askToken("Reading dead letters needs a token (read or admin). It is kept for this tab only.", loadDeadLetters);
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
    const [ov] = await Promise.all([getJSON("/status"), loadHistory()]);
    overview = ov;
    renderHealth(ov.verdict);
    renderRelay(ov.outbox);
    renderSinks(ov.outbox);
    renderFeeds();
    renderCharts();
    renderDetail();
    document.getElementById("updated").textContent = "updated " + new Date(ov.at).toLocaleTimeString();
    document.body.dataset.refreshed = String(Date.now());
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
