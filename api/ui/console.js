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
  const state = {
    view: "inbox", decided: new Map(), gates: [], busy: {}, again: {}, ds: null, projectsLoaded: false,
    // Pages: the API answers a page and a token for the next (null: no more). The inbox
    // and the runs list reload as many pages as they show; "More" shows one more.
    inboxPages: 1, runsPages: 1,
  };
  const PAGE_SIZE = 50;
  const withToken = (path, token) => (token ? path + "&page_token=" + encodeURIComponent(token) : path);

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
    const gates = [];
    let next = null;
    for (let page = 0; page < state.inboxPages; page++) {
      const data = await api("GET", withToken("/gates?status=pending&limit=" + PAGE_SIZE, next));
      if (token !== getToken()) return; // the token changed meanwhile: this answer is not theirs
      gates.push(...data.gates);
      next = data.next_page_token;
      if (!next) break;
    }
    $("#inbox-more").hidden = !next;
    const now = Date.now();
    for (const [id, at] of state.decided) if (now - at > DECIDED_HIDE_MS) state.decided.delete(id);
    const ids = new Set();
    state.gates = gates.filter((g) => !state.decided.has(g.gate_id) && !ids.has(g.gate_id) && ids.add(g.gate_id));
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
  // Each row names its family as the registry labels it (keel/families.py), and carries its
  // progress from the run's memo: the console lists no family of its own.
  function cell(tr, text, cls) {
    const td = document.createElement("td");
    if (cls) td.className = cls;
    if (text instanceof Node) td.appendChild(text); else td.textContent = text;
    tr.appendChild(td);
    return td;
  }

  async function loadRuns() {
    const token = getToken();
    const runs = [];
    let next = null;
    for (let page = 0; page < state.runsPages; page++) {
      const data = await api("GET", withToken("/runs?limit=" + PAGE_SIZE, next));
      if (token !== getToken()) return;
      runs.push(...data.runs);
      next = data.next_page_token;
      if (!next) break;
    }
    $("#runs-more").hidden = !next;
    const body = $("#runs-body");
    body.replaceChildren();
    const shown = new Set();
    for (const r of runs) {
      if (shown.has(r.workflow_id)) continue; // a run that moved between pages meanwhile
      shown.add(r.workflow_id);
      const tr = document.createElement("tr");
      tr.dataset.workflowId = r.workflow_id;
      cell(tr, r.workflow_id, "run-id");
      cell(tr, r.label || r.workflow_type);
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
    $("#runs-table").hidden = body.children.length === 0;
    $("#runs-empty").hidden = body.children.length > 0;
  }


  // --- design sessions -----------------------------------------------------------------
  // A session is one decision set. Its events arrive over /design/streams/{id} (Server-Sent
  // Events): EventSource cannot send the bearer header, so fetch() reads the stream and
  // this code parses it. Each card is keyed by the event's seq, so a reconnect or a reload
  // never shows one twice; the open session and its last seq live in session storage.
  const SESSION_KEY = "keel.console.session";
  const LIST_FIELDS = new Set(["regions", "workload_types", "storage_prefs", "observability_prefs", "existing_stack", "compliance"]);
  const NUMBER_FIELDS = new Set(["sla_latency_ms", "availability_target"]);
  const TERMINAL = new Set(["run-complete", "run-error"]);
  const LABELS = {
    "coverage-update": "Coverage", questions: "Questions", answers: "Answers",
    "plan-ready": "Plan", "reason-card": "Reason Card", "cost-update": "Cost",
    "policy-update": "Policy", "gate-waiting": "Approval needed", approval: "Decision",
    artifacts: "Repository", validation: "Validation", "diff-update": "Changes",
    "run-complete": "Session complete", "run-error": "Session failed",
  };

  const enc = (s) => encodeURIComponent(s);
  const encPath = (p) => p.split("/").map(enc).join("/");
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const k of kids) if (k != null) e.append(k instanceof Node ? k : String(k));
    return e;
  }
  const usd = (n) => n == null ? "unknown" : "$" + Number(n).toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
  const pct = (x) => Math.round(Number(x) * 100) + "%";

  function saveSession(sess) {
    if (!sess) { sessionStorage.removeItem(SESSION_KEY); return; }
    sessionStorage.setItem(SESSION_KEY, JSON.stringify({ project: sess.project, id: sess.id, lastSeq: sess.lastSeq }));
  }
  function storedSession() {
    try { return JSON.parse(sessionStorage.getItem(SESSION_KEY) || "null"); } catch (_) { return null; }
  }

  // Left panel: projects and their decision sets.
  async function loadProjects() {
    const token = getToken();
    const data = await api("GET", "/design/projects");
    const sets = await Promise.all(data.projects.map((p) =>
      api("GET", "/design/projects/" + enc(p.id) + "/decision-sets").then((d) => d.decision_sets, () => [])));
    if (token !== getToken()) return;
    const list = $("#project-list");
    list.replaceChildren();
    const ids = $("#project-ids");
    ids.replaceChildren();
    data.projects.forEach((p, i) => {
      ids.appendChild(el("option", { value: p.id }));
      const inner = el("ul", { class: "session-list" });
      for (const d of sets[i]) {
        const b = el("button", { type: "button", class: "nav-item session-item", "data-ds": d.id },
          el("span", { text: d.id }), el("span", { class: "muted small", text: d.version ? "v" + d.version + " " + d.status : d.status }));
        if (state.ds && state.ds.id === d.id) b.setAttribute("aria-current", "true");
        b.addEventListener("click", () => { show("design", true); openSession(p.id, d.id); });
        inner.appendChild(el("li", {}, b));
      }
      list.appendChild(el("li", {}, el("span", { class: "project-name", text: p.name && p.name !== p.id ? p.name + " (" + p.id + ")" : p.id }), inner));
    });
    $("#design-none").hidden = data.projects.length > 0;
  }

  function newSession() {
    closeSession();
    saveSession(null);
    $("#session-form").hidden = false;
    $("#session").hidden = true;
    $("#ds-status").hidden = true;
    $("#design-title").textContent = "Design session";
  }

  async function startSession(ev) {
    ev.preventDefault();
    const refusal = $("#session-refusal");
    refusal.textContent = "";
    const project = $("#session-project").value.trim();
    const text = $("#session-text").value.trim();
    if (!project || !text) { refusal.textContent = "Name a project and write the requirements."; return; }
    const button = $("#session-form button[type=submit]");
    button.disabled = true;
    try {
      await api("POST", "/design/projects", { id: project, name: project });
      const started = await api("POST", "/design/projects/" + enc(project) + "/constraints", {
        requirements: text, require_approval: true, generate: $("#session-generate").checked,
      });
      $("#session-text").value = "";
      openSession(project, started.decision_set_id);
      guarded("projects", loadProjects);
    } catch (err) {
      refusal.textContent = "Refused: " + explain(err);
    } finally {
      button.disabled = false;
    }
  }

  function closeSession() {
    if (state.ds) state.ds.abort.abort();
    state.ds = null;
    $("#timeline").replaceChildren();
    $("#canvas").hidden = true;
    $("#canvas-empty").hidden = false;
  }

  async function openSession(project, id, lastSeq) {
    closeSession();
    const sess = { project, id, lastSeq: -1, seen: new Set(), done: false, abort: new AbortController(), answered: new Set(), decided: new Set() };
    state.ds = sess;
    saveSession(sess);
    $("#session-form").hidden = true;
    $("#session").hidden = false;
    $("#design-title").textContent = "Design session";
    $("#ds-heading").textContent = project + " / " + id;
    $("#coverage").hidden = true;
    $("#session-actions").hidden = true;
    $("#session-action-refusal").textContent = "";
    setStatus("running");
    // The canvas is the open session's from its start (it said "No design session yet."
    // beside a running one until the run completed): its parts show as the run makes them.
    showCanvasOf(project, id);
    for (const b of document.querySelectorAll(".session-item")) {
      if (b.dataset.ds === id) b.setAttribute("aria-current", "true"); else b.removeAttribute("aria-current");
    }
    // What was already seen comes back in one read; the stream goes on after it.
    try {
      const page = await api("GET", "/design/decision-sets/" + enc(id) + "/events");
      if (state.ds !== sess) return;
      for (const e of page.events) handleEvent(sess, e.seq, e.type, e.payload);
    } catch (err) {
      if (state.ds !== sess) return;
      streamState(explain(err));
      if (err.status === 404) { saveSession(null); return; }
    }
    if (lastSeq != null && sess.lastSeq < lastSeq) streamState("Catching up from event " + lastSeq + "…");
    if (!sess.done) streamLoop(sess);
  }

  function streamState(text) { $("#stream-state").textContent = text; }
  function setStatus(text) {
    const s = $("#ds-status");
    s.hidden = false;
    s.textContent = text;
    s.className = "status status-" + text.replace(/\s+/g, "_");
  }

  async function streamLoop(sess) {
    let delay = 500;
    while (state.ds === sess && !sess.done) {
      try {
        const headers = { Authorization: "Bearer " + getToken(), Accept: "text/event-stream" };
        if (sess.lastSeq >= 0) headers["Last-Event-ID"] = String(sess.lastSeq);
        const resp = await fetch("/design/streams/" + enc(sess.id), { headers, cache: "no-store", signal: sess.abort.signal });
        if (!resp.ok) {
          let e = null;
          try { e = (await resp.json()).error; } catch (_) { e = null; }
          const err = new ApiError(resp.status, e ? e.code : "http_" + resp.status, e ? e.message : resp.statusText);
          if (resp.status === 401 || resp.status === 404) { streamState(explain(err)); return; }
          throw err;
        }
        streamState("Live.");
        delay = 500;
        await readStream(sess, resp.body);
        if (sess.done) break;
      } catch (err) {
        if (sess.abort.signal.aborted || state.ds !== sess) return;
        streamState("The stream broke (" + (err.message || err) + ").");
      }
      if (state.ds !== sess || sess.done) break;
      streamState("Reconnecting in " + Math.round(delay / 1000 * 10) / 10 + " s…");
      await sleep(delay);
      delay = Math.min(delay * 2, 15000);
    }
    if (state.ds === sess && sess.done) streamState("The session has ended.");
  }

  async function readStream(sess, body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buf += value.replace(/\r\n?/g, "\n");
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          const f = { id: null, event: "message", data: [] };
          for (const line of block.split("\n")) {
            if (!line || line.startsWith(":")) continue;
            const i = line.indexOf(":");
            const name = i < 0 ? line : line.slice(0, i);
            const val = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
            if (name === "id") f.id = val;
            else if (name === "event") f.event = val;
            else if (name === "data") f.data.push(val);
          }
          if (f.event === "ping" || f.id == null) continue;
          if (state.ds !== sess) return;
          handleEvent(sess, Number(f.id), f.event, JSON.parse(f.data.join("\n") || "{}"));
        }
      }
    } finally {
      reader.cancel().catch(() => {});
    }
  }

  function handleEvent(sess, seq, type, p) {
    if (sess.seen.has(seq)) return;
    sess.seen.add(seq);
    sess.lastSeq = Math.max(sess.lastSeq, seq);
    saveSession(sess);
    const card = el("li", { class: "event event-" + type, "data-seq": String(seq), "data-type": type });
    card.appendChild(el("p", { class: "event-head" },
      el("span", { class: "event-label", text: LABELS[type] || type }),
      p.node_name ? el("span", { class: "muted small", text: " · " + p.node_name }) : null));
    const body = el("div", { class: "event-body" });
    card.appendChild(body);
    (RENDER[type] || renderPlain)(sess, p, body, card);
    // Keep seq order even if a late read brings an earlier event.
    const list = $("#timeline");
    const after = [...list.children].find((li) => Number(li.dataset.seq) > seq);
    list.insertBefore(card, after || null);
    if (TERMINAL.has(type)) sess.done = true;
  }

  function renderPlain(sess, p, body) {
    const rest = Object.fromEntries(Object.entries(p).filter(([k]) => !["project_id", "decision_set_id", "node_name", "ts"].includes(k)));
    // A long event scrolls: focusable, so a keyboard can scroll it too (axe: scrollable-region-focusable).
    body.appendChild(el("pre", { class: "small code", tabindex: "0", text: JSON.stringify(rest, null, 1) }));
  }

  function facts(pairs) {
    const dl = el("dl", { class: "facts" });
    for (const [k, v] of pairs) if (v != null && v !== "") dl.appendChild(el("div", {}, el("dt", { text: k }), el("dd", { text: String(v) })));
    return dl;
  }

  function refuse(node, err) { node.textContent = "Refused: " + explain(err); }

  const RENDER = {
    "coverage-update"(sess, p, body) {
      $("#coverage").hidden = false;
      $("#coverage-meter").value = p.score;
      $("#coverage-value").textContent = pct(p.score) + (p.covered ? " (covered)" : "");
      body.appendChild(el("p", { text: pct(p.score) + (p.covered ? ": enough to plan." : ": not enough to plan yet.") }));
      if (p.missing && p.missing.length) body.appendChild(el("p", { class: "muted small", text: "Missing: " + p.missing.join(", ") }));
      // Fields the model read in a form that does not fit: asked below, the reason with each.
      const unfit = Object.keys(p.unfit || {});
      if (unfit.length) body.appendChild(el("p", { class: "muted small", text: "Not understood: " + unfit.join(", ") }));
    },
    questions(sess, p, body, card) {
      body.appendChild(el("p", { text: "Round " + p.round + ": " + (p.fields || []).join(", ") }));
      card.dataset.fields = (p.fields || []).join(",");
      const form = el("form", { class: "stack answers-form" });
      body.appendChild(form);
      loadQuestions(sess, form, p.fields || []);
    },
    answers(sess, p, body) {
      body.appendChild(el("p", { text: "Answered " + (p.fields || []).join(", ") + (p.by ? " by " + p.by : "") }));
      for (const f of document.querySelectorAll("#timeline .answers-form")) f.replaceWith(el("p", { class: "muted small", text: "Answered." }));
      sess.answered.add(true);
    },
    "plan-ready"(sess, p, body) {
      body.appendChild(el("p", { text: "Planner round " + p.round }));
      body.appendChild(facts(Object.entries(p.choices || {})));
      if (p.gaps && p.gaps.length) body.appendChild(el("p", { class: "muted small", text: "Gaps: " + p.gaps.join(", ") }));
      if (p.feedback) body.appendChild(el("p", { class: "muted small", text: "Replanned for the comment." }));
    },
    "reason-card"(sess, p, body) {
      const d = el("details", { class: "reason" });
      const conf = p.confidence != null ? " · confidence " + pct(p.confidence) : "";
      d.appendChild(el("summary", { text: p.agent + ": " + (p.choice ? p.choice.id : "no choice") + conf }));
      body.appendChild(d);
      // Built when first opened: a long timeline stays light.
      d.addEventListener("toggle", () => {
        if (!d.open || d.dataset.built) return;
        d.dataset.built = "1";
        if (p.choice) d.appendChild(el("p", { text: p.choice.justification }));
        if (p.candidates && p.candidates.length) {
          d.appendChild(el("p", { class: "small strong", text: "Candidates" }));
          const ul = el("ul", { class: "small" });
          for (const c of p.candidates) ul.appendChild(el("li", { text: c.id + ": " + c.summary + (c.tradeoffs && c.tradeoffs.length ? " (" + c.tradeoffs.join("; ") + ")" : "") }));
          d.appendChild(ul);
        }
        if (p.risks && p.risks.length) {
          d.appendChild(el("p", { class: "small strong", text: "Risks" }));
          const ul = el("ul", { class: "small" });
          for (const r of p.risks) ul.appendChild(el("li", { text: r }));
          d.appendChild(ul);
        }
        const pol = Object.entries(p.policy_results || {});
        if (pol.length) { d.appendChild(el("p", { class: "small strong", text: "Policy results" })); d.appendChild(facts(pol)); }
        const imp = Object.entries(p.impacts || {});
        if (imp.length) { d.appendChild(el("p", { class: "small strong", text: "Impacts" })); d.appendChild(facts(imp)); }
      });
    },
    "cost-update"(sess, p, body) {
      const delta = p.delta_vs_prev_usd != null ? " (" + (p.delta_vs_prev_usd >= 0 ? "+" : "") + usd(p.delta_vs_prev_usd) + " against the previous set)" : "";
      body.appendChild(el("p", { text: usd(p.monthly_usd) + " a month" + delta }));
      if (p.unpriced && p.unpriced.length) body.appendChild(el("p", { class: "muted small", text: p.unpriced.length + " line(s) without a price" }));
      if (state.ds === sess) renderCost(p);
    },
    "policy-update"(sess, p, body) {
      body.appendChild(el("p", { text: "Overall " + p.overall + (p.gate_required ? "; an approval is required" : "") }));
      // Cost and policy are in the canvas before the run ends (the gate waits on them).
      if (state.ds === sess) renderPolicy(p.overall);
      const d = el("details", {}, el("summary", { class: "small", text: (p.rules || []).length + " rules" }));
      const ul = el("ul", { class: "small" });
      for (const r of p.rules || []) ul.appendChild(el("li", { text: r.id + ": " + r.status + (r.detail ? " (" + r.detail + ")" : "") }));
      d.appendChild(ul);
      body.appendChild(d);
    },
    "gate-waiting"(sess, p, body, card) {
      card.dataset.gate = p.gate;
      body.appendChild(el("p", { text: "Planner round " + p.round + " waits for a decision (" + p.gate + ")." }));
      if (sess.decided.has(p.gate)) return;
      setStatus("waiting for approval");
      const id = "gate-comment-" + sess.id + "-" + p.gate;
      const form = el("form", { class: "stack decide-gate" },
        el("label", { for: id, text: "Comment" }),
        el("textarea", { id, rows: "2", class: "comment" }),
        el("div", { class: "row" },
          el("button", { type: "submit", class: "button primary", value: "approve", text: "Approve plan" }),
          el("button", { type: "submit", class: "button danger", value: "reject", text: "Reject plan" })),
        el("p", { class: "refusal", role: "alert" }));
      form.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        const decision = ev.submitter ? ev.submitter.value : "approve";
        const refusal = $(".refusal", form);
        refusal.textContent = "";
        const buttons = form.querySelectorAll("button");
        buttons.forEach((b) => (b.disabled = true));
        try {
          await api("POST", "/design/decision-sets/" + enc(sess.id) + "/approve", { status: decision, comment: $("textarea", form).value });
          refusal.textContent = "";
          notice((decision === "approve" ? "Approved" : "Rejected") + " planner round " + p.round + ".");
        } catch (err) {
          refuse(refusal, err);
        } finally {
          buttons.forEach((b) => (b.disabled = false));
        }
      });
      body.appendChild(form);
    },
    approval(sess, p, body) {
      sess.decided.add(p.gate);
      body.appendChild(el("p", { text: p.gate + " " + p.status + (p.by ? " by " + p.by : "") }));
      for (const li of document.querySelectorAll('#timeline li[data-gate]')) {
        if (li.dataset.gate === p.gate) { const f = $(".decide-gate", li); if (f) f.remove(); }
      }
      if (state.ds === sess) setStatus("running");
    },
    artifacts(sess, p, body) { body.appendChild(el("p", { text: p.files + " files generated." })); },
    validation(sess, p, body) {
      body.appendChild(facts(Object.entries(p.summary || {})));
      const failed = Object.entries(p.summary || {}).filter(([, s]) => s === "failed").map(([n]) => n);
      if (failed.length) body.appendChild(el("p", { class: "status status-validation_failed", text: "Validation failed: " + failed.join(", ") + "." }));
    },
    "diff-update"(sess, p, body) {
      body.appendChild(el("p", { text: "Against " + p.previous + "." }));
      renderPlain(sess, Object.fromEntries(Object.entries(p).filter(([k]) => k !== "previous")), body);
    },
    "run-complete"(sess, p, body) {
      const next = {
        completed: p.archive_digest ? "The repository is in the canvas." : "Generate the repository, or start a new session to change the requirements.",
        rejected: "The plan was rejected: start a new session with changed requirements.",
        expired: "The approval expired: start the session again.",
        not_covered: "The requirements stayed too open: start a new session with more detail.",
        validation_failed: "The generated repository failed a validator: its archive is in the canvas, marked as failing. Read the validators' findings, then start a new session.",
      }[p.status] || "";
      body.appendChild(el("p", { text: "Version " + p.version + ", " + p.status + "." }));
      if (next) body.appendChild(el("p", { class: "muted small", text: "Next: " + next }));
      if (state.ds === sess) {
        setStatus(p.status);
        $("#session-actions").hidden = !(p.status === "completed" && !p.archive_digest);
        guarded("canvas", () => loadCanvas(sess));
        guarded("projects", loadProjects);
      }
    },
    "run-error"(sess, p, body) {
      body.appendChild(el("p", { text: p.message || "The run ended " + p.status + "." }));
      const next = p.status === "terminated" || p.status === "canceled" || p.status === "cancelled"
        ? "Someone stopped this run. Start a new session to go on."
        : p.status === "timed_out" ? "The run ran out of time. Start the session again; if it recurs, check the worker is up."
        : "Check the worker's log and this run in the Temporal Web UI (design/" + sess.project + "/" + sess.id + "), fix the cause, then start a new session.";
      body.appendChild(el("p", { class: "muted small", text: "Next: " + next }));
      if (state.ds === sess) {
        setStatus(p.status || "failed");
        // The left panel's entry says how the run ended, not "running".
        guarded("projects", loadProjects);
      }
    },
  };

  async function loadQuestions(sess, form, fields) {
    let questions = [];
    // The event is written just before the pipeline starts waiting: ask again for a while.
    for (let tries = 0; tries < 40 && !questions.length && !sess.done && state.ds === sess; tries++) {
      if (tries) await sleep(250);
      try {
        const d = await api("GET", "/design/decision-sets/" + enc(sess.id));
        if (d.live && d.live.phase === "waiting_for_answers") questions = d.live.questions.filter((q) => fields.includes(q.field));
        else if (!d.live) break;
      } catch (_) { questions = []; }
      if (!form.isConnected) return;
    }
    if (!form.isConnected) return;
    if (!questions.length) { form.replaceWith(el("p", { class: "muted small", text: "Not open any more." })); return; }
    for (const q of questions) {
      const id = "answer-" + sess.id + "-" + q.field;
      form.appendChild(el("label", { for: id, text: q.text }));
      let input;
      if (q.choices && q.choices.length && !LIST_FIELDS.has(q.field)) {
        input = el("select", { id, name: q.field }, el("option", { value: "", text: "Choose…" }));
        for (const c of q.choices) input.appendChild(el("option", { value: c, text: c }));
      } else {
        input = el("input", { id, name: q.field, type: "text", spellcheck: "false" });
        if (q.choices && q.choices.length) input.setAttribute("placeholder", q.choices.slice(0, 3).join(", "));
      }
      input.setAttribute("aria-describedby", id + "-why");
      form.appendChild(input);
      form.appendChild(el("p", { id: id + "-why", class: "muted small", text: q.reason + (LIST_FIELDS.has(q.field) ? " (several: separate with commas)" : "") }));
    }
    form.appendChild(el("div", { class: "row" }, el("button", { type: "submit", class: "button primary", text: "Send answers" })));
    form.appendChild(el("p", { class: "refusal", role: "alert" }));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const answers = {};
      for (const inp of form.querySelectorAll("input, select")) {
        const v = inp.value.trim();
        if (!v) continue;
        if (LIST_FIELDS.has(inp.name)) answers[inp.name] = v.split(",").map((x) => x.trim()).filter(Boolean);
        else if (NUMBER_FIELDS.has(inp.name)) answers[inp.name] = Number(v);
        else if (v.startsWith("{")) { try { answers[inp.name] = JSON.parse(v); } catch (_) { answers[inp.name] = v; } }
        else answers[inp.name] = v;
      }
      const refusal = $(".refusal", form);
      refusal.textContent = "";
      if (!Object.keys(answers).length) { refusal.textContent = "Answer at least one question."; return; }
      const button = $("button", form);
      button.disabled = true;
      try {
        await api("POST", "/design/decision-sets/" + enc(sess.id) + "/answers", { answers });
      } catch (err) {
        refuse(refusal, err);
      } finally {
        button.disabled = false;
      }
    });
  }

  // Right panel: the repository, its changes, cost and reports.
  function showCanvasOf(project, id) {
    $("#canvas-empty").hidden = true;
    $("#canvas").hidden = false;
    $("#canvas-ds").textContent = project + " / " + id + ": its cost, reports and repository show here as the session makes them.";
    for (const part of ["#download-row", "#cost-section", "#reports-section", "#files-section", "#diff-section", "#viewer"]) $(part).hidden = true;
    $("#reports-list").replaceChildren();
    $("#cost-body").replaceChildren();
    // A running session's canvas (a cost table, no links yet) can scroll: keyboard users
    // reach it by Tab (axe: scrollable-region-focusable).
    $("#right").tabIndex = 0;
  }

  function renderCost(cost) {
    $("#cost-section").hidden = false;
    const delta = cost.delta_vs_prev_usd != null
      ? "; " + (cost.delta_vs_prev_usd >= 0 ? "+" : "") + usd(cost.delta_vs_prev_usd) + (cost.delta_vs_prev_pct != null ? " (" + (cost.delta_vs_prev_pct >= 0 ? "+" : "") + Number(cost.delta_vs_prev_pct).toFixed(1) + "%)" : "") + " against the previous set"
      : "";
    $("#cost-total").textContent = usd(cost.monthly_usd) + " a month" + delta;
    const tb = $("#cost-body");
    tb.replaceChildren();
    for (const l of cost.breakdown || []) {
      const tr = el("tr");
      cell(tr, l.service + (l.region ? " (" + l.region + ")" : ""));
      cell(tr, l.qty);
      cell(tr, usd(l.usd));
      tb.appendChild(tr);
    }
  }

  function renderPolicy(overall) {
    const reports = $("#reports-list");
    const old = $("li[data-report=policy]", reports);
    const li = el("li", { "data-report": "policy", text: "policy: " + overall });
    if (old) old.replaceWith(li); else reports.appendChild(li);
    $("#reports-section").hidden = false;
  }

  async function loadCanvas(sess) {
    const d = await api("GET", "/design/decision-sets/" + enc(sess.id));
    if (state.ds !== sess) return;
    $("#canvas-empty").hidden = true;
    $("#canvas").hidden = false;
    $("#canvas-ds").textContent = sess.project + " / " + sess.id + (d.stored && d.stored.parent_id ? " (previous: " + d.stored.parent_id + ")" : "");
    // Stored once the run persists; until then the cost-update event has shown it.
    if (d.cost) renderCost(d.cost);
    const reports = $("#reports-list");
    reports.replaceChildren();
    const v = d.validation && d.validation.summary ? Object.entries(d.validation.summary) : [];
    for (const [name, status] of v) reports.appendChild(el("li", {}, el("span", { text: name + ": " }), el("span", { class: "status status-" + status, text: status })));
    if (d.policy) reports.appendChild(el("li", { "data-report": "policy", text: "policy: " + d.policy.overall }));
    $("#reports-section").hidden = !reports.children.length;

    const archive = (d.artifacts || []).find((a) => a.kind === "archive");
    $("#download-row").hidden = !archive;
    $("#files-section").hidden = !archive;
    $("#diff-section").hidden = !archive;
    $("#viewer").hidden = true;
    if (!archive) return;
    const link = await api("GET", "/design/decision-sets/" + enc(sess.id) + "/download");
    $("#download-link").href = link.url;
    const failing = link.validation === "failed";
    $("#download-link").textContent = failing
      ? "Download the repository (zip): fails validation (" + link.failed_validators.join(", ") + ")"
      : "Download the repository (zip)";
    $("#download-link").classList.toggle("failing", failing);
    $("#download-row").dataset.validation = link.validation;
    const files = await api("GET", "/design/decision-sets/" + enc(sess.id) + "/files");
    renderTree(sess, files.files);
    const diff = await api("GET", "/design/decision-sets/" + enc(sess.id) + "/diff");
    if (state.ds !== sess) return;
    $("#diff-against").textContent = diff.previous_decision_set
      ? "Against " + diff.previous_decision_set + (diff.previous_has_files ? "" : " (planned only: every file is new)")
      : "No previous decision set.";
    const ul = $("#diff-list");
    ul.replaceChildren();
    for (const c of diff.changes) {
      const b = el("button", { type: "button", class: "link-button", "data-path": c.path, text: c.path });
      b.setAttribute("aria-label", "Diff of " + c.path);
      b.addEventListener("click", () => openFile(sess, c.path, true));
      ul.appendChild(el("li", {}, el("span", { class: "status small", text: c.status }), " ", b));
    }
  }

  function renderTree(sess, files) {
    const root = { dirs: new Map(), files: [] };
    for (const f of files) {
      const parts = f.path.split("/");
      let node = root;
      for (const d of parts.slice(0, -1)) {
        if (!node.dirs.has(d)) node.dirs.set(d, { dirs: new Map(), files: [] });
        node = node.dirs.get(d);
      }
      node.files.push(f);
    }
    const build = (node) => {
      const frag = document.createDocumentFragment();
      for (const [name, sub] of [...node.dirs].sort()) {
        const ul = el("ul", {});
        ul.appendChild(build(sub));
        frag.appendChild(el("li", { class: "dir" }, el("span", { class: "muted", text: name + "/" }), ul));
      }
      for (const f of node.files) {
        const b = el("button", { type: "button", class: "link-button", "data-path": f.path, text: f.path.split("/").pop() });
        b.setAttribute("aria-label", "Open " + f.path);
        b.addEventListener("click", () => openFile(sess, f.path, false));
        frag.appendChild(el("li", {}, b));
      }
      return frag;
    };
    $("#file-tree").replaceChildren(build(root));
  }

  async function openFile(sess, path, diff) {
    const viewer = $("#viewer");
    viewer.hidden = false;
    $("#viewer-title").textContent = (diff ? "Diff of " : "") + path;
    const pre = $("#viewer-text");
    pre.textContent = "Loading…";
    delete pre.dataset.kind;
    try {
      const r = diff
        ? await api("GET", "/design/decision-sets/" + enc(sess.id) + "/diff/" + encPath(path))
        : await api("GET", "/design/decision-sets/" + enc(sess.id) + "/files/" + encPath(path));
      if (state.ds !== sess) return;
      // File text is shown as text only: a generated file is never markup here.
      pre.textContent = diff ? (r.diff || "(" + r.status + ")") : r.text;
      pre.dataset.kind = diff ? "diff" : "file";
    } catch (err) {
      pre.textContent = "Refused: " + explain(err);
    }
  }

  async function generate() {
    const sess = state.ds;
    if (!sess) return;
    const refusal = $("#session-action-refusal");
    refusal.textContent = "";
    $("#generate-button").disabled = true;
    try {
      // The validators the run asks for: none named (the body empty) when every one is checked.
      const boxes = [...document.querySelectorAll('#generate-validators input[name="validator"]')];
      const chosen = boxes.filter((b) => b.checked).map((b) => b.value);
      const body = chosen.length === boxes.length ? {} : { validators: chosen };
      const started = await api("POST", "/design/decision-sets/" + enc(sess.id) + "/generate", body);
      openSession(sess.project, started.decision_set_id);
      guarded("projects", loadProjects);
    } catch (err) {
      refuse(refusal, err);
    } finally {
      $("#generate-button").disabled = false;
    }
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
    if (state.view === "design" && !state.projectsLoaded) {
      state.projectsLoaded = true;
      guarded("projects", loadProjects);
    }
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
    state.inboxPages = 1;
    state.runsPages = 1;
    $("#inbox-more").hidden = true;
    $("#runs-more").hidden = true;
    closeSession();
    saveSession(null);
    state.projectsLoaded = false;
    $("#project-list").replaceChildren();
    $("#design-none").hidden = false;
  }

  // --- wiring --------------------------------------------------------------------------
  function init() {
    applyTheme(currentTheme());
    for (const b of document.querySelectorAll(".nav-item[data-view]")) {
      b.addEventListener("click", () => show(b.dataset.view, true));
    }
    for (const b of document.querySelectorAll("[data-refresh]")) b.addEventListener("click", refresh);
    $("#inbox-more").addEventListener("click", () => {
      state.inboxPages += 1;
      guarded("inbox", loadInbox);
    });
    $("#runs-more").addEventListener("click", () => {
      state.runsPages += 1;
      guarded("runs", loadRuns);
    });
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
    $("#session-form").addEventListener("submit", startSession);
    $("#generate-button").addEventListener("click", generate);
    $("#new-session").addEventListener("click", newSession);
    $("#token-state").textContent = getToken() ? "A token is saved in this browser." : "No token saved.";
    const resumed = getToken() ? storedSession() : null;
    if (resumed) {
      // A reload goes back to the open session and resumes its stream.
      show("design", false);
      openSession(resumed.project, resumed.id, resumed.lastSeq);
    } else {
      show(getToken() ? "inbox" : "settings", false);
    }
    setInterval(tickExpiries, 1000);
    setInterval(() => { if (!document.hidden) refresh(); }, REFRESH_MS);
  }

  document.addEventListener("DOMContentLoaded", init);
})();
