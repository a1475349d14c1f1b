"use strict";
// The stream is found from this page's own address, so a reverse proxy may mount the
// dashboard under any prefix (…/dashboard → …/dashboard/events).
const base = location.pathname.replace(/\/+$/, "");
const HISTORY = 60;
const COLORS = ["#58a6ff", "#d2a8ff", "#3fb950", "#f0883e", "#ff7b72", "#79c0ff", "#e3b341", "#56d4dd"];
const history = new Map(); // "domain/rule" -> [{a, d}]
const $ = (id) => document.getElementById(id);
const fmt = (x) => x >= 100 ? Math.round(x).toString() : (Math.round(x * 10) / 10).toString();
const text = (el, s) => { el.textContent = s; };

function cell(row, value, numeric) {
  const td = row.insertCell();
  td.textContent = value;
  if (numeric) td.className = "n";
  return td;
}

function render(s) {
  text($("config-version"), "v" + s.config.version + (s.config.xds_version == null ? "" : ` (xDS ${s.config.xds_version})`));
  const r = s.config.last_reload;
  if (r) {
    const when = new Date(r.at_ms).toLocaleTimeString();
    const what = r.source === "xds" ? "xDS version" : "reload";
    $("reload").className = r.ok ? "ok" : "bad";
    text($("reload"), r.ok ? `${r.source === "xds" ? "xDS version applied" : "reloaded"} ${when} (v${r.version})` : `${what} rejected ${when}: ${r.errors.join("; ")}`);
  }
  text($("store-kind"), s.store.kind);
  $("store-health").className = s.store.reachable ? "ok" : "bad";
  text($("store-health"), s.store.reachable ? "reachable" : "unreachable");
  $("breaker").className = s.store.breaker_open ? "bad" : "ok";
  text($("breaker"), s.store.breaker_open ? "open (deciding by fail mode)" : `closed (opened ${s.store.breaker_opened}×)`);
  text($("store-failed"), `${s.store.failed_calls} (short-circuited ${s.store.short_circuited})`);
  text($("fallback"), `open ${s.fallback.open} · closed ${s.fallback.closed} · local ${s.fallback.local}`);

  const ws = $("ws");
  ws.replaceChildren();
  const kv = (k, v) => { const dt = document.createElement("dt"); dt.textContent = k; const dd = document.createElement("dd"); dd.textContent = v; ws.append(dt, dd); };
  if (s.websocket) {
    kv("connections", s.websocket.connections);
    kv("opened", s.websocket.opened_total);
    kv("refused upgrades", s.websocket.refused_upgrades_total);
    kv("closes", s.websocket.closes.map((c) => `${c.code}: ${c.count}`).join(", ") || "none");
  } else {
    kv("gateway", "not running");
  }

  // RLQS: streams (Envoys), and per rule the shares this instance's Envoys hold.
  const q = $("rlqs");
  q.replaceChildren();
  const qkv = (k, v) => { const dt = document.createElement("dt"); dt.textContent = k; const dd = document.createElement("dd"); dd.textContent = v; q.append(dt, dd); };
  qkv("streams", `${s.rlqs.streams} (${s.rlqs.buckets} buckets)`);
  for (const r of s.rlqs.rules) {
    qkv(`${r.domain}/${r.rule}`, `${r.members} buckets hold ${r.tokens} of ${r.limit} per ${r.period_ms / 1000}s`);
  }

  let allowed = 0, denied = 0, deniedTotal = 0;
  const body = $("rules").tBodies[0];
  body.replaceChildren();
  for (const rule of s.rules) {
    allowed += rule.allowed_per_sec; denied += rule.denied_per_sec; deniedTotal += rule.denied_total;
    const id = rule.domain + "/" + rule.rule;
    if (!history.has(id)) history.set(id, []);
    const h = history.get(id);
    h.push({ a: rule.allowed_per_sec, d: rule.denied_per_sec });
    if (h.length > HISTORY) h.shift();
    const row = body.insertRow();
    cell(row, rule.domain); cell(row, rule.name ? `${rule.rule} (${rule.name})` : rule.rule);
    cell(row, fmt(rule.allowed_per_sec), true);
    cell(row, fmt(rule.denied_per_sec), true).className = rule.denied_per_sec > 0 ? "n bad" : "n";
    cell(row, rule.denied_total, true);
  }
  text($("allowed-rate"), fmt(allowed));
  text($("denied-rate"), fmt(denied));
  text($("denied-total"), deniedTotal);
  $("denied-total").dataset.value = deniedTotal;

  const top = $("top-keys").tBodies[0];
  top.replaceChildren();
  for (const k of s.top_denied) {
    const row = top.insertRow();
    const code = document.createElement("code");
    code.textContent = k.key;
    row.insertCell().append(code);
    cell(row, k.count, true); cell(row, k.error, true);
  }
  draw();
}

function draw() {
  const canvas = $("chart");
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = w * ratio; canvas.height = h * ratio;
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  g.clearRect(0, 0, w, h);
  const left = 48, bottom = 22, top = 8, right = 8;
  let max = 1;
  for (const h of history.values()) for (const p of h) max = Math.max(max, p.a, p.d);
  max = niceCeil(max);
  g.strokeStyle = "#2a3542"; g.fillStyle = "#8a99a8"; g.font = "11px system-ui"; g.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const y = top + (h - top - bottom) * (1 - i / 4);
    g.beginPath(); g.moveTo(left, y); g.lineTo(w - right, y); g.stroke();
    g.fillText(fmt(max * i / 4), 4, y + 4);
  }
  g.fillText(`last ${HISTORY} s`, left, h - 6);
  const x = (i) => left + (w - left - right) * (i / (HISTORY - 1));
  const y = (v) => top + (h - top - bottom) * (1 - v / max);
  const legend = $("legend");
  legend.replaceChildren();
  let c = 0;
  for (const [id, h] of history) {
    const color = COLORS[c++ % COLORS.length];
    const offset = HISTORY - h.length;
    for (const [field, dash] of [["a", []], ["d", [5, 4]]]) {
      g.strokeStyle = color; g.lineWidth = 2; g.setLineDash(dash);
      g.beginPath();
      h.forEach((p, i) => (i ? g.lineTo : g.moveTo).call(g, x(offset + i), y(p[field])));
      g.stroke();
    }
    g.setLineDash([]);
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = color;
    item.append(swatch, `${id} (allowed solid, denied dashed)`);
    legend.append(item);
  }
  canvas.dataset.series = history.size;
}

function niceCeil(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

const state = (name, label) => { $("conn").dataset.state = name; text($("conn"), label); };

// The event stream. When the server refuses one (all the places open to this client are
// taken), the browser gives up on it: then poll the latest snapshot once a second instead,
// and try the stream again every 30 s.
let polling = null;
function connect() {
  const events = new EventSource(base + "/events");
  events.addEventListener("open", () => { stopPolling(); state("open", "live"); });
  events.addEventListener("snapshot", (e) => render(JSON.parse(e.data)));
  events.addEventListener("error", () => {
    if (events.readyState === EventSource.CLOSED) {
      startPolling();
      setTimeout(connect, 30000);
    } else {
      state("closed", "reconnecting…");
    }
  });
}

function startPolling() {
  if (polling) return;
  const poll = () => fetch(base + "/snapshot", { cache: "no-store" })
    .then((r) => r.ok ? r.json() : Promise.reject(new Error(r.status)))
    .then((s) => { state("polling", "live (polling)"); render(s); })
    .catch(() => state("closed", "reconnecting…"));
  poll();
  polling = setInterval(poll, 1000);
}

function stopPolling() {
  if (polling) { clearInterval(polling); polling = null; }
}

connect();
window.addEventListener("resize", draw);
