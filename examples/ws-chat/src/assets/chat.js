// The chat page: joins a room over a WebSocket, shows what the server's limiter says.
//
// * A `rate_limited` error frame shows a notice naming the limit and counts `retry_after_ms`
//   down live; the send button stays disabled until it reaches zero.
// * When the server closes the connection, the code and reason are shown (4008 after repeated
//   violations, 1009 for a message over the size limit, 1008 for too many malformed frames).
// * A connection the server refuses before the upgrade (HTTP 429) never opens; browsers do not
//   show its status, so the page says what it most likely was.
"use strict";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const me = {
  user: params.get("user") || "",
  room: params.get("room") || "lobby",
  role: params.get("role") || "",
};

// What each limit's notice says.
const SCOPES = {
  slowmode: ["Slowmode", "This room allows one message per interval from each name."],
  connection: ["Too fast", "This tab is sending faster than its message budget."],
  bytes: ["Too much data", "This tab is sending more bytes than its budget."],
  user: ["Too many messages", "Your name has used its budget across all of its tabs."],
  room: ["Busy room", "Everyone in this room together is over the room's budget."],
};

// The end of the current wait (performance.now() time), and its timer.
let blockedUntil = 0;
let ticker = 0;
let socket = null;
let opened = false;
let lastTyping = 0;
const typers = new Map();

function start() {
  if (!me.user) {
    $("login").hidden = false;
    $("room").value = me.room;
    $("name").focus();
    return;
  }
  $("chat").hidden = false;
  $("where").textContent = `#${me.room} as ${me.user}${me.role ? ` (${me.role})` : ""}`;
  $("send-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("text").value;
    if (!text.trim() || !send({ type: "chat", text })) return;
    $("text").value = "";
  });
  $("text").addEventListener("input", () => {
    const now = performance.now();
    if (now - lastTyping > 2000) {
      lastTyping = now;
      send({ type: "typing" });
    }
  });
  $("flood").addEventListener("click", () => {
    for (let i = 1; i <= 10; i++) send({ type: "chat", text: `flood ${i}/10` });
  });
  $("big").addEventListener("click", () => send({ type: "chat", text: "x".repeat(4096) }));
  $("reconnect").addEventListener("click", connect);
  connect();
}

function connect() {
  const query = new URLSearchParams({ room: me.room, user: me.user });
  if (me.role) query.set("role", me.role);
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  socket = new WebSocket(`${scheme}//${location.host}/ws?${query}`);
  opened = false;
  $("reconnect").hidden = true;
  setStatus("connecting", "connecting…");
  socket.addEventListener("open", () => {
    opened = true;
    setStatus("open", "connected");
    updateSendButton();
  });
  socket.addEventListener("message", (event) => receive(event.data));
  socket.addEventListener("close", closed);
}

function send(message) {
  if (!socket || socket.readyState !== WebSocket.OPEN) return false;
  socket.send(JSON.stringify(message));
  return true;
}

function receive(data) {
  let event;
  try {
    event = JSON.parse(data);
  } catch {
    line("sys", `unreadable frame from the server: ${data}`);
    return;
  }
  switch (event.type) {
    case "welcome":
      showLimits(event.limits || []);
      break;
    case "chat":
      chatLine(event);
      typers.delete(event.user);
      showTypers();
      break;
    case "typing":
      if (event.user !== me.user) {
        typers.set(event.user, performance.now() + 3000);
        showTypers();
        setTimeout(showTypers, 3100);
      }
      break;
    case "presence":
      line("sys", `${event.user} ${event.event} (${event.online} online)`);
      break;
    case "rate_limited":
      rateLimited(event);
      break;
    case "missed":
      line("sys", `you missed ${event.count} messages (this tab fell behind)`);
      break;
    case "error":
      line("sys", `the server did not understand: ${event.message}`);
      break;
    default:
      line("sys", `unknown frame: ${data}`);
  }
}

// The limiter's error frame: {"type":"rate_limited","scope":…,"retry_after_ms":…,…}.
function rateLimited(frame) {
  const [title, text] = SCOPES[frame.scope] || ["Rate limited", `Limit: ${frame.scope}.`];
  $("notice-title").textContent = title;
  $("notice-text").textContent = `${text} (scope "${frame.scope}", limit ${frame.limit})`;
  $("notice").dataset.scope = frame.scope;
  $("notice").hidden = false;
  // Never shorten a wait already announced: the later of the deadlines holds.
  blockedUntil = Math.max(blockedUntil, performance.now() + Number(frame.retry_after_ms));
  line("sys", `not sent: ${title.toLowerCase()} (retry after ${frame.retry_after_ms} ms)`);
  tick();
  if (!ticker) ticker = setInterval(tick, 100);
}

// Counts the wait down; at zero, hides the notice and enables sending again.
function tick() {
  const left = Math.max(0, blockedUntil - performance.now());
  const countdown = $("countdown");
  countdown.dataset.ms = String(Math.round(left));
  countdown.textContent = `${(left / 1000).toFixed(1)} s`;
  if (left === 0) {
    clearInterval(ticker);
    ticker = 0;
    $("notice").hidden = true;
  }
  updateSendButton();
}

function updateSendButton() {
  const open = socket && socket.readyState === WebSocket.OPEN;
  const waiting = blockedUntil > performance.now();
  $("send").disabled = !open || waiting;
  $("send").textContent = waiting ? "Wait…" : "Send";
  $("flood").disabled = !open;
  $("big").disabled = !open;
}

function closed(event) {
  const code = event.code;
  $("status").dataset.closeCode = String(code);
  let text;
  if (!opened) {
    text =
      "refused before the upgrade: most likely HTTP 429 (too many connections from this " +
      "address or name, or a penalty after repeated floods). Browsers do not show the " +
      "status; see the server's answer with curl -i. Try again shortly.";
  } else if (code === 1006) {
    text = "connection lost (1006)";
  } else {
    text = `closed by the server: ${code}${event.reason ? ` "${event.reason}"` : ""}`;
  }
  setStatus("closed", text);
  line("sys", text);
  $("reconnect").hidden = false;
  updateSendButton();
}

function setStatus(state, text) {
  $("status").dataset.state = state;
  $("status").textContent = text;
}

function showLimits(limits) {
  const list = $("limit-list");
  list.replaceChildren(
    ...limits.map((text) => {
      const item = document.createElement("li");
      item.textContent = text;
      return item;
    }),
  );
  $("limits").hidden = limits.length === 0;
}

function chatLine(event) {
  const item = document.createElement("li");
  item.className = "msg";
  const who = document.createElement("b");
  who.textContent = event.user;
  item.append(who);
  if (event.role) {
    const role = document.createElement("span");
    role.className = "role";
    role.textContent = event.role;
    item.append(" ", role);
  }
  const text = event.text.length > 200 ? `${event.text.slice(0, 200)}…` : event.text;
  item.append(`: ${text}`);
  append(item);
}

function line(kind, text) {
  const item = document.createElement("li");
  item.className = kind;
  item.textContent = text;
  append(item);
}

function append(item) {
  const log = $("log");
  log.append(item);
  while (log.children.length > 500) log.firstChild.remove();
  log.scrollTop = log.scrollHeight;
}

function showTypers() {
  const now = performance.now();
  for (const [user, until] of typers) if (until <= now) typers.delete(user);
  const names = [...typers.keys()];
  $("typing").textContent =
    names.length === 0 ? "" : `${names.join(", ")} ${names.length === 1 ? "is" : "are"} typing…`;
}

start();
