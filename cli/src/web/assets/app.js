// The Weft web console: one page, views by the address's #fragment. It reads the
// node's status from /api/status, live counters from /api/events (server-sent
// events), and sends changes with the session's CSRF token. Text from the mesh is
// only ever set as textContent, never parsed as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { status: null, session: null, sort: { key: "name", up: true }, history: [], policyTimer: null };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return e;
}
function svgEl(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

async function api(path, body) {
  const opts = { credentials: "same-origin", headers: {} };
  if (body !== undefined) {
    opts.method = "POST";
    opts.headers["content-type"] = "application/json";
    opts.headers["x-weft-csrf"] = state.session ? state.session.csrf : "";
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  if (r.status === 401) {
    location.reload();
    throw new Error("login required");
  }
  const j = await r.json();
  if (!r.ok) throw new Error(j.error || r.statusText);
  return j;
}

function problem(msg) {
  const p = $("problem");
  p.hidden = !msg;
  p.textContent = msg || "";
}

// ---- formatting ----
function bytes(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}
function rate(bps) { return bytes(bps) + "/s"; }
function date(unix) { return unix ? new Date(unix * 1000).toISOString().slice(0, 16).replace("T", " ") + " UTC" : "none"; }
function daysLeft(unix) { return unix ? Math.floor((unix * 1000 - Date.now()) / 86400000) : null; }
function online(p) { return p.state === "established" || p.state === "idle"; }
function pathText(p) {
  if (p.path === "relay") return "relayed via " + (p.via_hostname || p.via || "?");
  return p.path;
}

// ---- members ----
function memberRows() {
  const s = state.status;
  if (!s) return [];
  // This node first, as a row like the others.
  const self = {
    node_id: s.node_id, hostname: s.hostname, overlay: s.overlay, overlay6: s.overlay6, endpoint: (s.listeners || []).join(" "),
    groups: s.certificate ? s.certificate.groups : [], cert_not_after: s.certificate ? s.certificate.not_after : null,
    state: "established", path: "this node", transport: "", rtt_ms: null, loss: null, self: true,
    rx_bytes: s.pipelines.reduce((a, x) => a + x.rx_bytes, 0), tx_bytes: s.pipelines.reduce((a, x) => a + x.tx_bytes, 0),
  };
  return [self].concat(s.peers).map((p) => ({
    p,
    name: p.hostname,
    node_id: p.node_id,
    addr: [p.overlay, p.overlay6, p.endpoint].filter(Boolean).join(" "),
    groups: (p.groups || []).join(", "),
    expiry: p.cert_not_after || 0,
    online: online(p) ? 1 : 0,
    path: pathText(p),
    transport: p.transport,
    rtt: p.rtt_ms == null ? Infinity : p.rtt_ms,
    loss: p.loss == null ? Infinity : p.loss,
    traffic: p.rx_bytes + p.tx_bytes,
  }));
}

function renderMembers() {
  const q = $("search").value.trim().toLowerCase();
  const { key, up } = state.sort;
  const rows = memberRows()
    .filter((r) => !q || [r.name, r.node_id, r.p.key || "", r.addr, r.groups, r.path].join(" ").toLowerCase().includes(q))
    .sort((a, b) => (a[key] < b[key] ? -1 : a[key] > b[key] ? 1 : 0) * (up ? 1 : -1));
  const tb = $("members").tBodies[0];
  tb.replaceChildren(...rows.map((r) => {
    const p = r.p;
    const link = p.self ? el("strong", {}, p.hostname + " (this node)") : el("a", { href: "#member/" + p.node_id }, p.hostname || "(no name)");
    const tr = el("tr", { "data-node": p.node_id, class: online(p) ? "" : "offline" },
      el("td", {}, link), el("td", { class: "mono" }, p.node_id), el("td", {}, r.addr), el("td", {}, r.groups),
      el("td", {}, p.cert_not_after ? date(p.cert_not_after) : "none"),
      el("td", {}, online(p) ? "yes" : "no (" + p.state + ")"), el("td", { class: "path" }, r.path),
      el("td", {}, p.transport), el("td", { class: "num" }, p.rtt_ms == null ? "" : p.rtt_ms.toFixed(1) + " ms"),
      el("td", { class: "num" }, p.loss == null ? "" : (p.loss * 100).toFixed(0) + " %"),
      el("td", { class: "num" }, "↓" + bytes(p.rx_bytes) + " ↑" + bytes(p.tx_bytes)));
    return tr;
  }));
  for (const th of $("members").tHead.rows[0].cells) {
    th.classList.toggle("sorted", th.dataset.key === key);
    th.classList.toggle("up", th.dataset.key === key && up);
  }
}

function renderMember(id) {
  const s = state.status;
  const p = s && s.peers.find((x) => x.node_id === id);
  if (!p) {
    $("member-title").textContent = "No member " + id + " is known to this node";
    $("member-facts").replaceChildren();
    return;
  }
  $("member-title").textContent = p.hostname + " (" + p.node_id + ")";
  const route = s.routes.find((r) => r.node_id === id);
  const offer = (s.exit_offers || []).some((o) => o.node_id === id);
  const facts = [
    ["Node key", p.key || "unknown"], ["Overlay", [p.overlay, p.overlay6].filter(Boolean).join(", ")],
    ["Endpoint", p.endpoint || "none"], ["State", p.state + (p.error ? " (" + p.error + ")" : "")],
    ["Path", pathText(p) + ", " + p.hops + " hop(s)"], ["Transport", p.transport],
    ["Latency", p.rtt_ms == null ? "unknown" : p.rtt_ms.toFixed(1) + " ms"],
    ["Loss", p.loss == null ? "unknown" : (p.loss * 100).toFixed(0) + " %"],
    ["Groups", (p.groups || []).join(", ") || "none"],
    ["Certificate valid until", p.cert_not_after ? date(p.cert_not_after) : "no certificate"],
    ["Subnets", route && route.proxied.length ? route.proxied.join(", ") : "none"],
    ["Exit node", offer ? "offers itself as an exit" : "no"],
    ["Protocol version", p.protocol == null ? "unknown" : String(p.protocol)],
    ["Traffic", "received " + bytes(p.rx_bytes) + ", sent " + bytes(p.tx_bytes)],
    ["Last handshake", p.last_handshake_secs == null ? "never" : p.last_handshake_secs + " s ago"],
  ];
  $("member-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  const name = (nid) => (s.peers.find((x) => x.node_id === nid) || {}).hostname || (nid === s.node_id ? s.hostname : nid);
  const paths = s.routes.filter((r) => r.node_id === id || r.next_hop === id);
  $("member-paths").tBodies[0].replaceChildren(...paths.map((r) => el("tr", {},
    el("td", {}, r.hostname), el("td", {}, r.next_hop_hostname || name(r.next_hop)), el("td", {}, r.hops),
    el("td", {}, r.latency_ms + " ms"), el("td", {}, r.session ? "up" : "none"))));
  $("member-links").replaceChildren(...(p.neighbours || []).map((n) => el("li", {}, name(n.node_id) + " (" + n.rtt_ms + " ms)")));
}

// ---- map and throughput ----
function renderMap() {
  const s = state.status;
  const svg = $("map");
  if (!s) return;
  const nodes = [{ id: s.node_id, name: s.hostname, self: true, up: true }]
    .concat(s.peers.map((p) => ({ id: p.node_id, name: p.hostname, up: online(p) })));
  const pos = {};
  const cx = 300, cy = 210, r = Math.min(170, 60 + nodes.length * 12);
  nodes.forEach((n, i) => {
    const a = (2 * Math.PI * i) / nodes.length - Math.PI / 2;
    pos[n.id] = [cx + r * Math.cos(a), cy + r * Math.sin(a)];
  });
  const edges = new Set();
  const lines = [];
  const addEdge = (a, b) => {
    if (!pos[a] || !pos[b] || a === b) return;
    const k = a < b ? a + b : b + a;
    if (edges.has(k)) return;
    edges.add(k);
    lines.push(svgEl("line", { class: "link", x1: pos[a][0], y1: pos[a][1], x2: pos[b][0], y2: pos[b][1] }));
  };
  for (const p of s.peers) {
    if (p.link) addEdge(s.node_id, p.node_id);
    for (const n of p.neighbours || []) addEdge(p.node_id, n.node_id);
  }
  for (const p of s.peers.filter((p) => p.path === "relay" && p.via && pos[p.via])) {
    const [a, v, b] = [pos[s.node_id], pos[p.via], pos[p.node_id]];
    lines.push(svgEl("path", { class: "relay", d: `M${a[0]},${a[1]} Q${v[0]},${v[1]} ${b[0]},${b[1]}`, "data-relay": p.node_id }));
  }
  const drawn = nodes.map((n) => {
    const g = svgEl("g", { class: "node" + (n.self ? " self" : "") + (n.up ? "" : " down"), "data-node": n.id });
    g.append(svgEl("circle", { cx: pos[n.id][0], cy: pos[n.id][1], r: 9 }));
    const t = svgEl("text", { x: pos[n.id][0] + 12, y: pos[n.id][1] + 4 });
    t.textContent = n.name;
    g.append(t);
    return g;
  });
  svg.replaceChildren(...lines, ...drawn);
}

function onTraffic(ev) {
  const d = JSON.parse(ev.data);
  const h = state.history;
  h.push(d);
  while (h.length > 120) h.shift();
  renderPlot();
}

function renderPlot() {
  const h = state.history;
  const svg = $("plot");
  const rates = [];
  for (let i = 1; i < h.length; i++) {
    const dt = (h[i].t - h[i - 1].t) / 1000;
    if (dt <= 0) continue;
    rates.push({ rx: Math.max(0, h[i].rx_bytes - h[i - 1].rx_bytes) / dt, tx: Math.max(0, h[i].tx_bytes - h[i - 1].tx_bytes) / dt });
  }
  const max = Math.max(1024, ...rates.map((r) => Math.max(r.rx, r.tx)));
  const pts = (k) => rates.map((r, i) => `${10 + (i * 580) / 119},${150 - (r[k] / max) * 130}`).join(" ");
  const label = svgEl("text", { class: "axis", x: 12, y: 14 });
  label.textContent = "max " + rate(max) + " (blue: received, orange: sent)";
  svg.replaceChildren(label, svgEl("polyline", { class: "rx", points: pts("rx") }), svgEl("polyline", { class: "tx", points: pts("tx") }));
  const last = rates[rates.length - 1];
  $("rate").textContent = last ? "now: received " + rate(last.rx) + ", sent " + rate(last.tx) : "waiting for counters";
}

// ---- policy ----
function renderPolicy() {
  const s = state.status;
  $("policy-push").hidden = !(state.session && state.session.authority);
  const p = s && s.policy;
  const box = $("policy-in-force");
  if (!p) {
    box.replaceChildren(el("p", {}, "No access policy: every member reaches everything."));
    $("policy-rules").tBodies[0].replaceChildren();
    $("policy-denials").tBodies[0].replaceChildren();
    return;
  }
  box.replaceChildren(el("dl", {},
    el("dt", {}, "Version"), el("dd", { id: "policy-version" }, p.version),
    el("dt", {}, "Source"), el("dd", {}, p.source),
    el("dt", {}, "Tests"), el("dd", {}, p.tests_passed + " passed, " + p.tests_skipped + " skipped"),
    el("dt", {}, "Flows tracked"), el("dd", {}, p.flows),
    el("dt", {}, "Denied packets"), el("dd", { id: "policy-denied" }, p.denied + (p.table_full + p.source_full ? " (+ " + (p.table_full + p.source_full) + " refused for room)" : "")),
    ...(p.refused ? [el("dt", {}, "Refused"), el("dd", { class: "error" }, p.refused)] : [])));
  const texts = p.rule_text || [];
  $("policy-rules").tBodies[0].replaceChildren(...p.hits.map((h, i) => el("tr", {},
    el("td", {}, i + 1), el("td", {}, texts[i] || "rule " + (i + 1)), el("td", { class: "num" }, h))));
  // Addresses with the member's name where the node knows it.
  const names = new Map((s.peers || []).map((m) => [m.overlay, m.hostname]));
  names.set(String(s.overlay || "").split("/")[0], s.hostname + " (this node)");
  const who = (a) => names.has(a) ? names.get(a) + " " + a : a;
  const denials = p.recent_denials || [];
  $("policy-denials").tBodies[0].replaceChildren(...(denials.length ? denials.map((d) => el("tr", {},
    el("td", {}, who(d.src)), el("td", {}, who(d.dst)), el("td", {}, d.proto), el("td", { class: "num" }, d.port),
    el("td", {}, d.last_secs_ago + " s ago"), el("td", { class: "num" }, d.count)))
    : [el("tr", {}, el("td", { colspan: 6, class: "dim" }, "none since the node started"))]));
}

function checkPolicySoon() {
  clearTimeout(state.policyTimer);
  state.policyTimer = setTimeout(checkPolicy, 300);
}

async function checkPolicy() {
  const out = $("policy-check");
  const text = $("policy-text").value;
  if (!text.trim()) { out.textContent = ""; out.className = "dim"; return; }
  try {
    const r = await api("/api/policy/check", { text });
    if (r.error) {
      out.textContent = "✗ " + r.error;
      out.className = "error";
    } else if (!r.ok) {
      out.textContent = "✗ the file checks (" + r.rules + " rule(s), " + r.tests + " test(s)), but against this node's members: " + r.members.error;
      out.className = "error";
    } else {
      out.textContent = "✓ " + r.rules + " rule(s), " + r.tests + " test(s) passed; against the members: " +
        r.members.passed + " passed, " + r.members.skipped + " skipped; version " + r.version;
      out.className = "ok";
    }
    out.dataset.ok = r.ok ? "yes" : "no";
  } catch (e) {
    out.textContent = String(e.message || e);
    out.className = "error";
  }
}

async function pushPolicy() {
  const res = $("policy-push-result");
  res.textContent = "signing and pushing…";
  try {
    const r = await api("/api/policy/push", { text: $("policy-text").value });
    res.textContent = "pushed: " + r.done;
    res.className = "ok";
    refresh();
  } catch (e) {
    res.textContent = "not pushed: " + e.message;
    res.className = "error";
  }
}

async function explain(ev) {
  ev.preventDefault();
  const out = $("explain-result");
  try {
    const flow = { from: $("explain-from").value, to: $("explain-to").value, proto: $("explain-proto").value };
    if ($("explain-against").value === "draft") flow.draft = $("policy-text").value;
    const r = await api("/api/policy/explain", flow);
    out.textContent = r.done;
    out.className = "";
  } catch (e) {
    out.textContent = e.message;
    out.className = "error";
  }
}

// ---- membership ----
function renderMembership() {
  const s = state.status;
  const sess = state.session;
  if (!s || !sess) return;
  $("authority-note").textContent = sess.authority
    ? "This console holds the authority key " + sess.authority + (sess.invites ? "." : "; invites also need the network secret (WEFT_NETWORK_SECRET).")
    : "This console has no authority key: invites, revocations and policy pushes are offered only when `weft web` is started with --authority-key.";
  $("invite-box").hidden = !sess.invites;
  $("policy-push").hidden = !sess.authority;
  $("revoke-list").tBodies[0].replaceChildren(...s.peers.map((p) => {
    const cell = el("td", {});
    if (sess.authority && p.key) {
      const b = el("button", { type: "button", class: "danger", "data-revoke": p.node_id }, "Revoke…");
      b.addEventListener("click", () => askRevoke(p));
      cell.append(b);
    }
    return el("tr", {}, el("td", {}, p.hostname), el("td", { class: "mono" }, p.node_id),
      el("td", {}, p.cert_not_after ? "until " + date(p.cert_not_after) : "none"), cell);
  }));
  const soon = [];
  if (s.certificate) soon.push([s.hostname + " (this node)", s.certificate.not_after]);
  for (const p of s.peers) if (p.cert_not_after) soon.push([p.hostname, p.cert_not_after]);
  const expiring = soon.filter(([, t]) => daysLeft(t) < 30).sort((a, b) => a[1] - b[1]);
  $("expiring").replaceChildren(...(expiring.length ? expiring.map(([n, t]) => el("li", {}, n + ": " + date(t) + " (" + daysLeft(t) + " days)"))
    : [el("li", { class: "dim" }, "none")]));
  $("revoked").replaceChildren(...(s.revocations.length ? s.revocations.map((r) => el("li", { class: "mono" }, r))
    : [el("li", { class: "dim" }, "none")]));
}

let revoking = null;
function askRevoke(p) {
  revoking = p;
  $("revoke-name").textContent = p.hostname + " (" + p.node_id + ")";
  $("revoke-confirm").value = "";
  $("revoke-dialog").showModal();
}

async function doRevoke(ev) {
  ev.preventDefault();
  const p = revoking;
  $("revoke-dialog").close();
  if (!p) return;
  const out = $("revoke-result");
  try {
    const r = await api("/api/revoke", { key: p.key, confirm: $("revoke-confirm").value });
    out.textContent = "revoked " + p.hostname + ": " + r.done;
    out.className = "ok";
    refresh();
  } catch (e) {
    out.textContent = "not revoked: " + e.message;
    out.className = "error";
  }
}

async function makeInvite(ev) {
  ev.preventDefault();
  $("invite-error").textContent = "";
  try {
    const r = await api("/api/invite", {
      groups: $("invite-groups").value, uses: Number($("invite-uses").value || 0), expires: $("invite-expires").value,
      cert_expires: $("invite-cert-expires").value, peers: $("invite-peers").value,
    });
    $("invite-summary").textContent = "Invite " + r.id.slice(0, 16) + "…: groups " + (r.groups.join(", ") || "none") + ", " + r.uses +
      ", usable until " + r.expires + ", entry points " + r.entry_points.join(", ") + ". It carries the network secret: hand it over as you would the secret.";
    $("invite-token").value = r.token;
    $("invite-qr").src = "data:image/svg+xml;base64," + r.qr_svg;
    $("invite-result").hidden = false;
  } catch (e) {
    $("invite-error").textContent = e.message;
  }
}

// ---- views ----
function show() {
  const [view, arg] = (location.hash.slice(1) || "members").split("/");
  for (const v of ["members", "member", "map", "policy", "membership"]) $("view-" + v).hidden = v !== view;
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.id === "nav-" + (view === "member" ? "members" : view));
  render(view, arg);
}

function render(view, arg) {
  const s = state.status;
  if (s) {
    $("node-name").textContent = s.hostname + " (" + s.node_id + ")";
    $("network").textContent = "network " + s.network_name + ", " + s.peers.length + " other member(s)";
  }
  if (view === "members") renderMembers();
  if (view === "member") renderMember(arg);
  if (view === "map") { renderMap(); renderPlot(); }
  if (view === "policy") renderPolicy();
  if (view === "membership") renderMembership();
}

async function refresh() {
  try {
    state.status = await api("/api/status");
    problem("");
  } catch (e) {
    problem("Cannot read the node's status: " + e.message);
  }
  const [view, arg] = (location.hash.slice(1) || "members").split("/");
  render(view, arg);
}

async function start() {
  try {
    state.session = await api("/api/session");
  } catch (e) {
    problem(e.message);
    return;
  }
  $("search").addEventListener("input", renderMembers);
  for (const th of $("members").tHead.rows[0].cells) {
    th.addEventListener("click", () => {
      const k = th.dataset.key;
      state.sort = { key: k, up: state.sort.key === k ? !state.sort.up : true };
      renderMembers();
    });
  }
  $("policy-text").addEventListener("input", checkPolicySoon);
  $("policy-push").addEventListener("click", pushPolicy);
  $("explain").addEventListener("submit", explain);
  $("invite").addEventListener("submit", makeInvite);
  $("revoke-form").addEventListener("submit", doRevoke);
  $("revoke-cancel").addEventListener("click", () => $("revoke-dialog").close());
  $("logout").addEventListener("click", async () => { await api("/api/logout", {}); location.reload(); });
  window.addEventListener("hashchange", show);
  const es = new EventSource("/api/events");
  es.addEventListener("traffic", onTraffic);
  await refresh();
  show();
  setInterval(refresh, 2000);
}

start();
