// The Postbox admin page: reads /api with the bearer token and renders with textContent only
// (event data is never parsed as HTML).
"use strict";

const REFRESH_MS = 3000;
let token = sessionStorage.getItem("postbox-token");

// A token passed as #token=… (from a link) is kept for this tab and removed from the address.
function tokenFromLink() {
  if (!location.hash.startsWith("#token=")) return false;
  token = decodeURIComponent(location.hash.slice("#token=".length));
  sessionStorage.setItem("postbox-token", token);
  history.replaceState(null, "", location.pathname);
  return true;
}
tokenFromLink();
// The same link opened in a tab already on the page changes only the fragment.
window.addEventListener("hashchange", () => { if (tokenFromLink()) refresh(); });

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) tr.appendChild(c instanceof Node ? c : el("td", c));
  return tr;
}

function num(n) { return el("td", n, "num"); }

function age(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 120) return `${seconds.toFixed(1)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    headers: { "Authorization": `Bearer ${token || ""}`, "Content-Type": "application/json" },
  });
  if (response.status === 401) {
    showLogin("The token was refused.");
    throw new Error("unauthorized");
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

function showLogin(message) {
  document.getElementById("login").hidden = false;
  document.getElementById("relay").textContent = message || "sign in to see the relay";
}

function renderStatus(status) {
  const relay = status.relay;
  document.getElementById("relay").textContent = relay
    ? `relay ${relay.id}: ${relay.published} published, ${relay.failed_tries} failed tries, ${relay.gave_up} FAILED`
    : "no relay in this process";
  document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;

  const backlog = document.querySelector("#backlog tbody");
  backlog.replaceChildren(...status.targets.map(t => row([
    el("td", t.tenant), num(t.pending), num(t.processing),
    el("td", t.failed, t.failed > 0 ? "num down" : "num"),
    el("td", age(t.oldest_pending_age)),
  ])));

  const sinks = document.querySelector("#sinks tbody");
  const list = relay ? relay.sinks : status.reported_sinks;
  if (!list || list.length === 0) {
    sinks.replaceChildren(row([el("td", "no sink reports its state (in-process handlers)", "muted")]));
  } else {
    sinks.replaceChildren(...list.map(s => row([
      el("td", s.name), el("td", s.up ? "up" : "down", s.up ? "up" : "down"),
      el("td", new Date(s.since).toLocaleString()), el("td", s.last_error || "", "err"),
    ])));
  }

  const points = status.history || [];
  const rates = document.getElementById("rates");
  if (points.length > 0) {
    const last = points[points.length - 1];
    const rate = last.published / Math.max(last.seconds, 0.001);
    const latency = last.mean_latency === null ? "—" : age(last.mean_latency);
    rates.textContent = `now: ${rate.toFixed(1)} events/s, mean latency ${latency}, backlog ${last.backlog}`;
    drawChart(points);
  }
}

function drawChart(points) {
  const svg = document.getElementById("chart");
  const ns = "http://www.w3.org/2000/svg";
  const rates = points.map(p => p.published / Math.max(p.seconds, 0.001));
  const max = Math.max(1, ...rates);
  // One slot per point of the last 15 minutes (5 s each), the newest at the right.
  const slots = Math.max(180, points.length);
  const width = 600 / slots;
  const offset = slots - points.length;
  svg.replaceChildren(...rates.map((r, i) => {
    const bar = document.createElementNS(ns, "rect");
    const h = (r / max) * 86;
    bar.setAttribute("x", String((offset + i) * width));
    bar.setAttribute("y", String(88 - h));
    bar.setAttribute("width", String(Math.max(width - 1, 1)));
    bar.setAttribute("height", String(h));
    bar.setAttribute("fill", points[i].gave_up > 0 ? "#b3261e" : "#3b6fd8");
    const title = document.createElementNS(ns, "title");
    title.textContent = `${r.toFixed(1)} events/s` +
      (points[i].mean_latency === null ? "" : `, mean latency ${age(points[i].mean_latency)}`);
    bar.appendChild(title);
    return bar;
  }));
}

async function renderFailed(status) {
  const tbody = document.querySelector("#failed tbody");
  const rows = [];
  for (const t of status.targets.filter(t => t.failed > 0)) {
    const page = await api(`/api/events?status=FAILED&limit=20&tenant=${encodeURIComponent(t.tenant)}`);
    for (const e of page.events) {
      const retry = el("button", "Retry");
      retry.addEventListener("click", () => retryEvent(t.tenant, e.id, retry));
      const action = el("td"); action.appendChild(retry);
      rows.push(row([
        num(e.id), el("td", t.tenant), el("td", e.event_type),
        el("td", [e.aggregate_type, e.aggregate_id].filter(Boolean).join(" ")),
        num(e.retry_count), el("td", e.last_error || "", "err"),
        el("td", new Date(e.updated_at).toLocaleString()), action,
      ]));
    }
  }
  if (rows.length === 0) rows.push(row([el("td", "none", "muted")]));
  tbody.replaceChildren(...rows);
}

async function retryEvent(tenant, id, button) {
  button.disabled = true;
  const notice = document.getElementById("notice");
  try {
    await api(`/api/events/${id}/retry?tenant=${encodeURIComponent(tenant)}`, { method: "POST" });
    notice.textContent = `Event ${id} is back in the queue.`;
  } catch (e) {
    notice.textContent = `Retry of event ${id} failed: ${e.message}`;
    button.disabled = false;
  }
  refresh();
}

async function refresh() {
  if (!token) { showLogin(); return; }
  try {
    const status = await api("/api/status");
    document.getElementById("login").hidden = true;
    renderStatus(status);
    await renderFailed(status);
  } catch (e) {
    if (e.message !== "unauthorized") {
      document.getElementById("updated").textContent = `error: ${e.message}`;
    }
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login-form").addEventListener("submit", ev => {
    ev.preventDefault();
    token = document.getElementById("token").value.trim();
    sessionStorage.setItem("postbox-token", token);
    refresh();
  });
  refresh();
  setInterval(refresh, REFRESH_MS);
});
