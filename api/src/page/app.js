// Spool's chat page: sign in with a token, list threads, send, follow the reply's stream.
// The stream's contract (docs/streaming.md): text since the last tool result is tentative, and
// `attempt_restarted` drops it (a new attempt writes it again); EventSource reconnects by itself
// with Last-Event-ID after a dropped network, and the gateway resumes after that event.
"use strict";

const $ = (id) => document.getElementById(id);
let token = null;
let thread = null;
let source = null;
let active = null; // the reply being followed: {workflow, message, el, committed, tentative}

function signOut(reason) {
  sessionStorage.removeItem("spool-token");
  token = null;
  if (source) source.close();
  source = null;
  $("signin-reason").textContent = reason;
  $("app").hidden = true;
  $("signin").hidden = false;
}

async function api(method, path, body, headers = {}) {
  const init = { method, headers: { Authorization: `Bearer ${token}`, ...headers } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 401) {
    signOut("The token was refused (expired or invalid): sign in again.");
    throw new Error("unauthorized");
  }
  const data = response.status === 204 ? null : await response.json().catch(() => null);
  if (!response.ok) throw new Error(data?.error?.message || response.statusText);
  return data;
}

function setStatus(text) {
  $("status").textContent = text;
}

function bubble(role, id) {
  const el = document.createElement("div");
  el.className = "message";
  el.dataset.role = role;
  if (id) el.dataset.messageId = id;
  $("messages").append(el);
  el.scrollIntoView({ block: "end" });
  return el;
}

function draw(el, parts) {
  el.replaceChildren();
  for (const part of parts) {
    if (part.type === "text") {
      el.append(document.createTextNode(part.text));
    } else {
      const tool = document.createElement("span");
      tool.className = "tool";
      tool.textContent = `⚙ ${part.name}: ${part.state}`;
      el.append(tool);
    }
  }
}

function storedParts(message) {
  const parts = [];
  for (const p of message.parts || []) {
    if (p.type === "text") parts.push({ type: "text", text: p.text });
    if (p.type === "tool_call") parts.push({ type: "tool", id: p.tool_call_id, name: p.name, state: "called" });
    if (p.type === "tool_result") {
      const call = parts.find((x) => x.type === "tool" && x.id === p.tool_call_id);
      if (call) call.state = p.is_error ? "failed" : "answered";
    }
  }
  if (!parts.some((p) => p.type === "text") && message.content) parts.push({ type: "text", text: message.content });
  return parts;
}

function renderStored(message, el = bubble("assistant", message.id)) {
  el.dataset.status = message.status;
  draw(el, storedParts(message));
}

async function loadThreads() {
  const page = await api("GET", "/v1/threads?limit=50");
  const list = $("threads");
  list.replaceChildren();
  for (const t of page.data) {
    const li = document.createElement("li");
    li.textContent = t.title || `${t.id.slice(0, 8)} · ${new Date(t.last_message_at || t.created_at).toLocaleString()}`;
    li.dataset.thread = t.id;
    li.classList.toggle("active", t.id === thread);
    li.onclick = () => openThread(t.id, false);
    list.append(li);
  }
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
let opening = 0; // the latest openThread: an earlier one that is still loading stops
let loading = Promise.resolve(); // the latest openThread's load: a message is sent after it

function openThread(id, fresh) {
  loading = loadThread(id, fresh).catch(() => {});
  return loading;
}

async function loadThread(id, fresh) {
  const mine = ++opening;
  if (source) source.close();
  source = null;
  active = null;
  thread = id;
  history.replaceState(null, "", `?thread=${id}`);
  $("thread-title").textContent = fresh ? "New thread" : id;
  $("messages").replaceChildren();
  $("pending").replaceChildren();
  $("cancel").hidden = true;
  setStatus("");
  for (const li of $("threads").children) li.classList.toggle("active", li.dataset.thread === id);
  if (fresh) return;
  let info;
  try {
    info = await api("GET", `/v1/threads/${id}`);
  } catch {
    return; // a thread no one has written to yet: it starts empty
  }
  if (mine !== opening) return;
  $("thread-title").textContent = info.title || id;
  const page = await api("GET", `/v1/threads/${id}/messages?limit=200`);
  if (mine !== opening) return;
  for (const m of page.messages) {
    if (m.role === "user") bubble("user").textContent = m.content;
    else if (m.status !== "queued" && m.status !== "streaming") renderStored(m);
  }
  if (info.active_workflow_id) {
    const run = await api("GET", `/v1/workflows/${info.active_workflow_id}`);
    if (mine !== opening) return;
    follow(run.workflow_id, run.message_id);
  }
}

async function reloadMessage(el, message) {
  const page = await api("GET", `/v1/threads/${thread}/messages?limit=200`);
  const stored = page.messages.find((m) => m.id === message);
  if (stored) renderStored(stored, el);
}

function follow(workflow, message) {
  const el = document.querySelector(`[data-message-id="${message}"]`) || bubble("assistant", message);
  el.dataset.status = "streaming";
  active = { workflow, message, el, committed: [], tentative: [] };
  const reply = active;
  const threadId = thread;
  const redraw = () => draw(el, [...reply.committed, ...reply.tentative]);
  $("cancel").hidden = false;
  setStatus("queued");
  let es = null;
  let lastEntry = null; // the last entry id seen, to resume from with a fresh token
  const finish = (status) => {
    if (es) es.close();
    if (source === es) source = null;
    if (active === reply) active = null;
    if (status) el.dataset.status = status;
    $("cancel").hidden = true;
    $("pending").replaceChildren();
    setStatus(status && status !== "completed" ? `run ${status}` : "");
    loadThreads().catch(() => {});
  };
  const on = (type, handle) =>
    es.addEventListener(type, (e) => {
      if (e.data === undefined) return; // EventSource's own `error`: it reconnects
      if (e.lastEventId) lastEntry = e.lastEventId;
      const envelope = JSON.parse(e.data);
      if (envelope.message_id !== message) {
        // An agent run this reply started (agents as tools): its answer comes back as the
        // tool's result; what it waits for is shown, since the reply waits for it too.
        if (envelope.depth > 0) nested(type, envelope);
        return;
      }
      handle(envelope.data || {}, envelope);
    });
  const nested = (type, envelope) => {
    const d = envelope.data || {};
    if (type === "message_start") setStatus("an agent it called is working");
    else if (type === "requires_action") showClientTools(envelope.workflow_id, d);
    else if (type === "approval_requested") showApproval(envelope.workflow_id, d);
    else if (type === "done") setStatus("running");
  };
  // The stream URL carries a token for this thread's stream only, valid 5 minutes, never the
  // long-lived token (URLs end up in histories and logs). EventSource resumes a dropped network
  // by itself (Last-Event-ID) while that token is valid; once the server refuses it (expired),
  // EventSource gives up, and a fresh token resumes after the last entry seen.
  const connect = async () => {
    const minted = await api("POST", `/v1/threads/${threadId}/stream_token`);
    if (active !== reply) return;
    const cursor = lastEntry ? `last_entry_id=${encodeURIComponent(lastEntry)}` : `last_message_id=${message}`;
    es = new EventSource(`/v1/threads/${threadId}/stream?access_token=${encodeURIComponent(minted.token)}&${cursor}`);
    source = es;
    attach();
  };
  const reconnect = () => connect().catch((err) => setStatus(err.message));
  const attach = () => {
    on("message_start", () => setStatus("running"));
    on("text_delta", (d) => {
      const last = reply.tentative[reply.tentative.length - 1];
      if (last && last.type === "text") last.text += d.delta;
      else reply.tentative.push({ type: "text", text: d.delta });
      redraw();
    });
    on("step", (d) => {
      if (d.phase === "call") {
        reply.tentative.push({ type: "tool", id: d.tool_call_id, name: d.tool_name, state: "running" });
      } else {
        const call = [...reply.committed, ...reply.tentative].find((p) => p.type === "tool" && p.id === d.tool_call_id);
        if (call) call.state = d.is_error ? "failed" : "answered";
        reply.committed.push(...reply.tentative);
        reply.tentative = [];
      }
      redraw();
    });
    on("attempt_restarted", () => {
      reply.tentative = [];
      redraw();
      setStatus("a worker restarted the run; resuming");
    });
    on("requires_action", (d) => showClientTools(workflow, d));
    on("approval_requested", (d) => showApproval(workflow, d));
    on("error", (d) => setStatus(`error ${d.code}: ${d.message}`));
    // The reply's final status is shown at `done`, once the page is ready for the next message.
    on("done", (d) => finish(d.status));
    for (const type of ["message_not_streaming", "stream_reset"]) {
      es.addEventListener(type, () => {
        finish(null);
        reloadMessage(el, message).catch(() => {});
      });
    }
    const mine = es;
    es.addEventListener("error", (e) => {
      if (e.data !== undefined || source !== mine) return;
      setStatus("reconnecting…");
      if (mine.readyState === EventSource.CLOSED && active === reply) setTimeout(reconnect, 1000);
    });
  };
  reconnect();
}

function actionBox(title) {
  $("pending").replaceChildren();
  const box = document.createElement("div");
  box.className = "action";
  const heading = document.createElement("div");
  heading.textContent = title;
  box.append(heading);
  $("pending").append(box);
  return box;
}

// Posts the answer of an action box. The run may ask its next question before this reply
// arrives (its event comes on the stream): only this box goes, never what replaced it.
async function answer(box, post) {
  for (const button of box.querySelectorAll("button")) button.disabled = true;
  try {
    await post();
  } catch (err) {
    for (const button of box.querySelectorAll("button")) button.disabled = false;
    if (box.isConnected) setStatus(err.message);
    return;
  }
  if (box.isConnected) {
    box.remove();
    setStatus("running");
  }
}

function showApproval(workflow, d) {
  setStatus("waiting for an approval");
  const box = actionBox(`Approve ${d.tool_name}(${JSON.stringify(d.arguments)})?`);
  box.dataset.action = "approval";
  for (const [label, approved] of [["Approve", true], ["Deny", false]]) {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = label;
    button.onclick = () =>
      answer(box, () => api("POST", `/v1/workflows/${workflow}/approvals/${d.tool_call_id}`, { approved }));
    box.append(button);
  }
}

function showClientTools(workflow, d) {
  setStatus("waiting for client tool outputs");
  const box = actionBox("The agent asks this page for tool outputs:");
  box.dataset.action = "tool_outputs";
  const inputs = d.tool_calls.map((call) => {
    const label = document.createElement("label");
    label.textContent = `${call.tool_name}(${JSON.stringify(call.arguments)}) → `;
    const input = document.createElement("input");
    input.dataset.toolCallId = call.tool_call_id;
    label.append(input);
    box.append(label);
    return input;
  });
  const submit = document.createElement("button");
  submit.type = "button";
  submit.textContent = "Send outputs";
  submit.onclick = () => {
    const tool_outputs = inputs.map((i) => ({ tool_call_id: i.dataset.toolCallId, output: i.value }));
    return answer(box, () => api("POST", `/v1/workflows/${workflow}/tool_outputs`, { tool_outputs }));
  };
  box.append(submit);
}

// The agent picker (agents:read; hidden without it): the agents of the tenant, and the chosen
// one's tools with their health (an MCP server's probe: healthy, unhealthy, pending).
let agents = [];
async function loadAgents() {
  let page;
  try {
    page = await api("GET", "/v1/agents");
  } catch {
    return; // no agents:read: the default agent answers
  }
  agents = page.agents || [];
  const select = $("agent");
  const fallback = document.createElement("option");
  fallback.value = "";
  fallback.textContent = "Default";
  select.replaceChildren(fallback);
  for (const agent of agents) {
    const option = document.createElement("option");
    option.value = agent.id;
    option.textContent = agent.name;
    select.append(option);
  }
  const kept = sessionStorage.getItem("spool-agent");
  if (kept && agents.some((a) => a.id === kept)) select.value = kept;
  $("agent-picker").hidden = agents.length === 0;
  await showTools();
}

function toolBadge(name, kind, health, title) {
  const li = document.createElement("li");
  li.textContent = `${name} · ${kind}${health && health !== "enabled" ? ` · ${health}` : ""}`;
  li.dataset.health = health || "enabled";
  if (title) li.title = title;
  return li;
}

async function showTools() {
  const list = $("agent-tools");
  const agent = agents.find((a) => a.id === $("agent").value);
  const badges = [];
  for (const tool of agent?.tools || []) badges.push(toolBadge(tool.name, tool.type));
  for (const ref of agent?.tool_ids || []) {
    try {
      const tool = await api("GET", `/v1/tools/${ref.tool_id}`);
      const health = tool.enabled === false ? "disabled" : tool.status;
      badges.push(toolBadge(tool.name, tool.type, health, tool.error || ""));
    } catch (err) {
      badges.push(toolBadge(ref.tool_id, "tool", "unhealthy", err.message));
    }
  }
  list.replaceChildren(...badges);
  list.hidden = badges.length === 0;
}

async function send() {
  // A thread still loading would otherwise draw its history after this message, and follow
  // the run this message starts a second time. Another thread opened meanwhile: not sent.
  const asked = thread;
  for (let load = null; load !== loading; ) {
    load = loading;
    await load;
  }
  if (thread !== asked) return;
  const text = $("input").value.trim();
  if (!text) return;
  if (active) {
    setStatus("the reply is still streaming: send when it is done (or cancel it)");
    return;
  }
  $("input").value = "";
  bubble("user").textContent = text;
  try {
    const body = { input_text: text };
    if ($("agent").value) body.agent_id = $("agent").value;
    const accepted = await api("POST", `/v1/threads/${thread}/user_message`, body,
      { "Idempotency-Key": crypto.randomUUID() });
    follow(accepted.workflow_id, accepted.message_id);
    loadThreads().catch(() => {});
  } catch (err) {
    setStatus(err.message);
  }
}

// Who a token says it is, from its payload (unverified: for showing only; the server checks).
function claims(t) {
  try {
    const payload = t.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(payload)) || {};
  } catch {
    return {};
  }
}

function describe(t) {
  const c = claims(t);
  return `${c.sub ?? "unknown user"} (tenant ${c.tenant ?? "unknown"})`;
}

// A token in the link (`/#token=`) replaces a session's token only if the user agrees: anyone
// can send a link, and one with their own token would sign the user into their account, where
// what the user types can be read (login CSRF). True if the stored token changed.
function tokenFromLink() {
  const offered = new URLSearchParams(location.hash.slice(1)).get("token");
  if (!offered) return false;
  history.replaceState(null, "", location.pathname + location.search);
  const current = sessionStorage.getItem("spool-token");
  if (current === offered) return false;
  if (current && !confirm(`This link signs you in as ${describe(offered)}, `
    + `replacing your session as ${describe(current)}. Switch accounts?`)) return false;
  sessionStorage.setItem("spool-token", offered);
  return true;
}

function start() {
  tokenFromLink();
  token = sessionStorage.getItem("spool-token");
  if (!token) {
    signOut("Sign in with a token (spool-api token --sub U --tenant T).");
    return;
  }
  $("who").textContent = `Signed in as ${describe(token)}`;
  $("signin").hidden = true;
  $("app").hidden = false;
  // Only a UUID: the id goes into API paths.
  const asked = new URLSearchParams(location.search).get("thread");
  const wanted = asked && UUID.test(asked) ? asked : null;
  loadThreads().catch(() => {});
  loadAgents().catch(() => {});
  openThread(wanted || crypto.randomUUID(), !wanted);
}

$("signin-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem("spool-token", $("token-input").value.trim());
  start();
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    send();
  }
});
$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  send();
});
// A link followed while the page is open changes only the fragment: asked about the same way.
window.addEventListener("hashchange", () => {
  if (tokenFromLink()) location.reload();
});
$("agent").addEventListener("change", () => {
  sessionStorage.setItem("spool-agent", $("agent").value);
  showTools().catch(() => {});
});
$("new-thread").onclick = () => openThread(crypto.randomUUID(), true);
$("cancel").onclick = () => {
  if (active) api("POST", `/v1/workflows/${active.workflow}/cancel`, { reason: "cancelled from the page" }).catch((err) => setStatus(err.message));
};
start();
