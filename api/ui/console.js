// Keel console: plain JavaScript, no build step, no third-party code. It calls the Keel
// JSON API with the bearer token kept in this browser's local storage (never in a URL).
"use strict";

(() => {
  const TOKEN_KEY = "keel.console.token";
  const THEME_KEY = "keel.console.theme";
  const REFRESH_MS = 5000;
  // A decided gate may linger in Temporal's visibility store for a moment: do not show
  // it again while that lasts.
  const DECIDED_HIDE_MS = 60000;

  const $ = (sel, root = document) => root.querySelector(sel);
  const state = { view: "inbox", decided: new Map(), gates: [], busy: {}, again: {} };

  // --- token and API -------------------------------------------------------------------
  const getToken = () => localStorage.getItem(TOKEN_KEY) || "";

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(method, path, body) {
    const token = getToken();
    if (!token) throw new ApiError(0, "no_token", "Enter your API token in Settings.");
    const headers = { Authorization: "Bearer " + token, Accept: "application/json" };
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      if (window.crypto && crypto.randomUUID) headers["Idempotency-Key"] = crypto.randomUUID();
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(path, init);
    } catch (err) {
      throw new ApiError(0, "unreachable", "The Keel API did not answer: " + err.message);
    }
    let data = null;
    try { data = await resp.json(); } catch (_) { data = null; }
    if (!resp.ok) {
      const e = data && data.error ? data.error : { code: "http_" + resp.status, message: resp.statusText };
      throw new ApiError(resp.status, e.code, e.message);
    }
    return data;
  }

  const gatePath = (id) => "/gates/" + id.split("/").map(encodeURIComponent).join("/");

  // --- notices -------------------------------------------------------------------------
  function notice(text) { $("#notice").textContent = text; }
  function explain(err) {
    if (err.code === "no_token") return err.message;
    if (err.status === 401) return "The API refused the token: " + err.message + " (Settings).";
    return err.message;
  }

  // --- views ---------------------------------------------------------------------------
  function show(view, focus) {
    state.view = view;
    for (const el of document.querySelectorAll(".view")) el.hidden = el.id !== "view-" + view;
    for (const b of document.querySelectorAll(".nav-item[data-view]")) {
      if (b.dataset.view === view) b.setAttribute("aria-current", "page");
      else b.removeAttribute("aria-current");
    }
    setNav(false);
    if (focus) $("#centre").focus();
    refresh();
  }

  function setNav(open) {
    $("#left").classList.toggle("open", open);
    $("#nav-toggle").setAttribute("aria-expanded", String(open));
  }
  function setCanvas(open) {
    $("#right").classList.toggle("open", open);
    $("#canvas-toggle").setAttribute("aria-expanded", String(open));
  }

  // --- theme ---------------------------------------------------------------------------
  function applyTheme(theme) {
    if (theme === "light" || theme === "dark") document.documentElement.dataset.theme = theme;
    else delete document.documentElement.dataset.theme;
    $("#theme-name").textContent = theme;
    for (const r of document.querySelectorAll('input[name="theme"]')) r.checked = r.value === theme;
  }
  function setTheme(theme) {
    localStorage.setItem(THEME_KEY, theme);
    applyTheme(theme);
  }
  const currentTheme = () => localStorage.getItem(THEME_KEY) || "system";

  // --- inbox ---------------------------------------------------------------------------
  function relative(ms) {
    const s = Math.round(Math.abs(ms) / 1000);
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600);
    const m = Math.floor((s % 3600) / 60), sec = s % 60;
    if (d) return d + "d " + h + "h";
    if (h) return h + "h " + m + "m";
    if (m) return m + "m " + sec + "s";
    return sec + "s";
  }

  function tickExpiries() {
    const now = Date.now();
    for (const t of document.querySelectorAll(".gate-expiry[datetime]")) {
      const left = Date.parse(t.getAttribute("datetime")) - now;
      t.textContent = left > 0 ? "in " + relative(left) : "expired " + relative(left) + " ago";
      t.dataset.soon = String(left < 3600 * 1000);
    }
  }

  function setCount(n) {
    const badge = $("#inbox-count");
    badge.textContent = String(n);
    badge.dataset.count = String(n);
  }

  function gateCard(g) {
    const li = $("#gate-card").content.firstElementChild.cloneNode(true);
    li.dataset.gateId = g.gate_id;
    const slug = g.gate_id.replace(/[^A-Za-z0-9_-]/g, "_");
    $(".gate-subject", li).textContent = g.subject || g.name || g.gate_id;
    $(".gate-name", li).textContent = g.name || "";
    $(".gate-parent", li).textContent = g.parent_id || g.gate_id;
    $(".gate-requester", li).textContent = g.requester || "unknown";
    $(".gate-approvers", li).textContent =
      g.approvers == null ? "unknown" : g.approvers.length ? g.approvers.join(", ") : "any approver";
    const t = $(".gate-expiry", li);
    if (g.expires_at) t.setAttribute("datetime", g.expires_at);
    else t.textContent = "unknown";
    const area = $(".comment", li);
    area.id = "comment-" + slug;
    $(".comment-label", li).setAttribute("for", area.id);
    for (const b of li.querySelectorAll("button")) {
      b.setAttribute("aria-label", b.textContent + ": " + (g.subject || g.gate_id));
    }
    $("form", li).addEventListener("submit", (ev) => {
      ev.preventDefault();
      decide(li, g, ev.submitter ? ev.submitter.value : "approve");
    });
    return li;
  }

  async function decide(li, g, decision) {
    const buttons = li.querySelectorAll("button");
    const refusal = $(".refusal", li);
    refusal.textContent = "";
    buttons.forEach((b) => (b.disabled = true));
    try {
      await api("POST", gatePath(g.gate_id) + "/" + decision, { comment: $(".comment", li).value });
      state.decided.set(g.gate_id, Date.now());
      li.remove();
      state.gates = state.gates.filter((x) => x.gate_id !== g.gate_id);
      setCount(state.gates.length);
      $("#inbox-empty").hidden = state.gates.length > 0;
      notice((decision === "approve" ? "Approved: " : "Rejected: ") + (g.subject || g.gate_id));
    } catch (err) {
      refusal.textContent = "Refused: " + explain(err);
      if (err.code === "gate_closed") state.decided.set(g.gate_id, Date.now());
    } finally {
      buttons.forEach((b) => (b.disabled = false));
    }
  }

  async function loadInbox() {
    const token = getToken();
    const data = await api("GET", "/gates?status=pending");
    if (token !== getToken()) return; // the token changed meanwhile: this answer is not theirs
    const now = Date.now();
    for (const [id, at] of state.decided) if (now - at > DECIDED_HIDE_MS) state.decided.delete(id);
    state.gates = data.gates.filter((g) => !state.decided.has(g.gate_id));
    setCount(state.gates.length);
    const list = $("#inbox-list");
    // Keep cards that are still pending, so a comment being typed is not lost.
    const keep = new Set(state.gates.map((g) => g.gate_id));
    for (const li of [...list.children]) if (!keep.has(li.dataset.gateId)) li.remove();
    const present = new Set([...list.children].map((li) => li.dataset.gateId));
    state.gates.forEach((g, i) => {
      if (!present.has(g.gate_id)) list.insertBefore(gateCard(g), list.children[i] || null);
    });
    $("#inbox-empty").hidden = state.gates.length > 0;
    tickExpiries();
  }

  // --- runs ----------------------------------------------------------------------------
  const FAMILY = { rllm: ".rllm run", mrp: "MRP job", srl: "SRL collection" };

  function cell(tr, text, cls) {
    const td = document.createElement("td");
    if (cls) td.className = cls;
    if (text instanceof Node) td.appendChild(text); else td.textContent = text;
    tr.appendChild(td);
    return td;
  }

  async function loadRuns() {
    const token = getToken();
    const data = await api("GET", "/runs?limit=50");
    if (token !== getToken()) return;
    const body = $("#runs-body");
    body.replaceChildren();
    for (const r of data.runs) {
      const tr = document.createElement("tr");
      tr.dataset.workflowId = r.workflow_id;
      cell(tr, r.workflow_id, "run-id");
      cell(tr, FAMILY[r.family] || r.workflow_type);
      const pill = document.createElement("span");
      pill.className = "status status-" + r.status;
      pill.textContent = r.status.replace("_", " ");
      cell(tr, pill);
      cell(tr, r.progress || (r.status === "running" ? "…" : ""));
      cell(tr, r.started_at ? relative(Date.now() - Date.parse(r.started_at)) + " ago" : "");
      const a = document.createElement("a");
      a.href = r.ui_url;
      a.target = "_blank";
      a.rel = "noopener noreferrer";
      a.textContent = "Temporal UI";
      a.setAttribute("aria-label", "Open " + r.workflow_id + " in the Temporal Web UI");
      cell(tr, a);
      body.appendChild(tr);
    }
    $("#runs-table").hidden = data.runs.length === 0;
    $("#runs-empty").hidden = data.runs.length > 0;
  }

  // --- refresh loop --------------------------------------------------------------------
  async function guarded(name, fn) {
    // One load of each kind at a time; a load asked for meanwhile runs right after it.
    if (state.busy[name]) { state.again[name] = true; return; }
    state.busy[name] = true;
    try {
      await fn();
      if ($("#notice").dataset.kind === "error") { notice(""); delete $("#notice").dataset.kind; }
    } catch (err) {
      notice(explain(err));
      $("#notice").dataset.kind = "error";
    } finally {
      state.busy[name] = false;
      if (state.again[name]) { state.again[name] = false; guarded(name, fn); }
    }
  }

  function refresh() {
    if (!getToken()) {
      notice("Enter your API token in Settings to see your inbox and runs.");
      $("#notice").dataset.kind = "error";
      return;
    }
    if (state.view === "runs") guarded("runs", loadRuns);
    // The inbox count shows on every view.
    guarded("inbox", loadInbox);
  }

  // What one token saw is not shown to the next.
  function clearData() {
    state.gates = [];
    state.decided.clear();
    setCount(0);
    $("#inbox-list").replaceChildren();
    $("#runs-body").replaceChildren();
    $("#runs-table").hidden = true;
  }

  // --- wiring --------------------------------------------------------------------------
  function init() {
    applyTheme(currentTheme());
    for (const b of document.querySelectorAll(".nav-item[data-view]")) {
      b.addEventListener("click", () => show(b.dataset.view, true));
    }
    for (const b of document.querySelectorAll("[data-refresh]")) b.addEventListener("click", refresh);
    $("#nav-toggle").addEventListener("click", () => setNav(!$("#left").classList.contains("open")));
    $("#canvas-toggle").addEventListener("click", () => setCanvas(!$("#right").classList.contains("open")));
    $("#theme-toggle").addEventListener("click", () => {
      const order = ["system", "light", "dark"];
      setTheme(order[(order.indexOf(currentTheme()) + 1) % order.length]);
    });
    for (const r of document.querySelectorAll('input[name="theme"]')) {
      r.addEventListener("change", () => r.checked && setTheme(r.value));
    }
    $("#token-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const value = $("#token-input").value.trim();
      if (!value) return;
      localStorage.setItem(TOKEN_KEY, value);
      clearData();
      $("#token-input").value = "";
      $("#token-state").textContent = "Token saved in this browser.";
      notice("");
      show("inbox", true);
    });
    $("#token-forget").addEventListener("click", () => {
      localStorage.removeItem(TOKEN_KEY);
      $("#token-state").textContent = "Token forgotten.";
      clearData();
    });
    document.addEventListener("keydown", (ev) => {
      if (ev.key === "Escape") { setNav(false); setCanvas(false); }
    });
    $("#token-state").textContent = getToken() ? "A token is saved in this browser." : "No token saved.";
    show(getToken() ? "inbox" : "settings", false);
    setInterval(tickExpiries, 1000);
    setInterval(() => { if (!document.hidden) refresh(); }, REFRESH_MS);
  }

  document.addEventListener("DOMContentLoaded", init);
})();
