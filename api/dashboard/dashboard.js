// outboxd dashboard: reads the JSON API every second and redraws the
// relay panel and a row per feed. Everything from the API is put in the
// page as text (never as HTML).
"use strict";

const REFRESH_MS = 1000;
const HISTORY_MS = 5 * 60 * 1000; // the sparkline shows the last 5 minutes
const RATE_WINDOW_MS = 10 * 1000; // the applied rate is averaged over 10 s
const SPARK_MIN_SPAN_MS = 60 * 1000;
const SVG = "http://www.w3.org/2000/svg";

const history = new Map(); // feed name -> [{t, lag, applied}]

function el(tag, props, ...children) {
  const e = document.createElement(tag);
  Object.assign(e, props || {});
  for (const c of children) e.append(c);
  return e;
}

async function getJSON(path) {
  const res = await fetch(path, { cache: "no-store", headers: { Accept: "application/json" } });
  if (!res.ok) throw new Error(path + ": HTTP " + res.status);
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

function record(fs, now) {
  let h = history.get(fs.feed);
  if (!h) history.set(fs.feed, (h = []));
  h.push({ t: now, lag: fs.lag, applied: fs.applied });
  while (h.length > 0 && h[0].t < now - HISTORY_MS) h.shift();
  return h;
}

function rate(h, now) {
  const last = h[h.length - 1];
  const first = h.find((p) => p.t >= now - RATE_WINDOW_MS) || h[0];
  if (!last || last.t === first.t) return null;
  return Math.max(last.applied - first.applied, 0) / ((last.t - first.t) / 1000);
}

function sparkline(h) {
  const w = 120, ht = 22;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", w);
  svg.setAttribute("height", ht);
  svg.setAttribute("viewBox", `0 0 ${w} ${ht}`);
  svg.setAttribute("aria-label", "lag over the last minutes");
  if (h.length > 0) {
    const secs = Math.round((h[h.length - 1].t - h[0].t) / 1000);
    const title = document.createElementNS(SVG, "title");
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
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", pts.join(" "));
    svg.append(line);
  }
  return svg;
}

function lossItem(l) {
  const li = el("li", {}, `${new Date(l.at).toLocaleString()}: ${l.reason} `,
    el("span", { className: "range", textContent: l.extent === "unknown"
      ? `(partition ${l.partition}, from ${l.from}, extent unknown)`
      : `(partition ${l.partition}, ${l.from}–${l.to})` }));
  if (l.ackedAt) {
    li.className = "acked";
    li.append(" — acknowledged");
  }
  return li;
}

function feedRow(fs, h, now) {
  const tr = el("tr", { className: "feed" + (fs.lossless ? "" : " lossy-row") });
  tr.dataset.feed = fs.feed;
  tr.dataset.state = fs.state;

  tr.append(el("td", { className: "name" },
    el("div", { className: "feed-name", textContent: fs.feed }),
    el("div", { className: "feed-source", textContent: `${fs.kind}:${fs.source} → ${fs.processor}` })));

  const state = el("td", { className: "state" }, el("span", { className: "pill state-" + fs.state, textContent: fs.state }));
  if (fs.lastError) state.append(el("p", { className: "error last-error", textContent: fs.lastError }));
  tr.append(state);

  tr.append(el("td", { className: "position", textContent: `${fs.position} / ${fs.end}` }));
  tr.append(el("td", { className: "lag" }, el("span", { className: "lag-value", textContent: String(fs.lag) }), sparkline(h)));
  tr.append(el("td", { className: "applied" },
    el("div", { className: "applied-total", textContent: String(fs.applied) }),
    el("div", { className: "applied-rate muted", textContent: fmtRate(rate(h, now)) })));

  const dl = el("a", { className: "dead-letters", textContent: String(fs.deadLettered) });
  dl.href = "/feeds/" + encodeURIComponent(fs.feed) + "/dead-letters";
  tr.append(el("td", {}, dl));

  const loss = el("td", { className: "lossless" });
  if (fs.lossless) {
    loss.append(el("span", { className: "badge lossless", textContent: "lossless" }));
  } else {
    loss.append(el("span", { className: "badge lossy", textContent: "NOT LOSSLESS" }));
  }
  if (fs.losses.length > 0) {
    const shown = fs.lossless ? fs.losses.filter((l) => !l.ackedAt) : fs.losses;
    if (shown.length > 0) loss.append(el("ul", { className: "losses" }, ...shown.map(lossItem)));
    const acked = fs.losses.length - fs.losses.filter((l) => !l.ackedAt).length;
    if (fs.lossless && acked > 0) loss.append(el("div", { className: "muted", textContent: `${acked} acknowledged` }));
  }
  if (fs.lossCount > fs.losses.length) {
    loss.append(el("div", { className: "muted", textContent: `${fs.lossCount - fs.losses.length} older losses not listed` }));
  }
  tr.append(loss);

  tr.append(el("td", { className: "outbox" },
    el("div", { textContent: `${fs.outbox.pending} pending` }),
    el("div", { className: "muted", textContent: fmtAge(fs.outbox.oldestPendingAge) })));
  return tr;
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

function renderFeeds(statuses, now) {
  const rows = statuses.map((fs) => feedRow(fs, record(fs, now), now));
  document.querySelector("#feeds tbody").replaceChildren(...rows);
  document.getElementById("nofeeds").hidden = rows.length > 0;
  for (const name of history.keys()) {
    if (!statuses.some((fs) => fs.feed === name)) history.delete(name);
  }
}

function setConn(ok, err) {
  const c = document.getElementById("conn");
  c.className = "conn " + (ok ? "ok" : "down");
  c.textContent = ok ? "live" : "API unreachable";
  c.title = ok ? "" : String(err);
}

async function refresh() {
  try {
    const [list, os] = await Promise.all([getJSON("/feeds"), getJSON("/outbox/status")]);
    const statuses = await Promise.all(
      list.feeds.map((f) => getJSON("/feeds/" + encodeURIComponent(f.feed) + "/status")));
    const now = Date.now();
    renderRelay(os);
    renderFeeds(statuses, now);
    document.getElementById("updated").textContent = "updated " + new Date(now).toLocaleTimeString();
    document.body.dataset.refreshed = String(now);
    setConn(true);
  } catch (err) {
    setConn(false, err);
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

refresh();
