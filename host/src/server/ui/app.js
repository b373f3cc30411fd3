// The warden operator console. Plain script, no dependencies. Every value from the
// server is put into the page as text (textContent / attributes), never as markup.
// The token lives in sessionStorage of this origin and travels only as an
// Authorization header on this origin's API.
'use strict';

/** sessionStorage key of the token ('' = the open API of a loopback server). */
const TOKEN_KEY = 'warden.token';
/** How often lists refresh (plugins, sessions, audit), ms. The task list is pushed. */
const POLL_MS = 2000;
/** How often elapsed times of running tasks tick on the task list, ms. */
const TICK_MS = 1000;
/** Most tasks the task list shows (the server lists at most 500, the newest first). */
const MAX_TASK_ROWS = 500;
/** How often pending approvals are checked, ms: an answer shows within a second. */
const APPROVAL_POLL_MS = 1000;
/** Pause before following a task's events again after the stream broke, ms. */
const RECONNECT_MS = 1000;
/** How long a notice stays, ms. */
const TOAST_MS = 4000;
/** Tools whose file_path names a file the task wrote. */
const WRITING_TOOLS = ['Write', 'Edit', 'MultiEdit', 'NotebookEdit'];

const state = {
  me: null,
  pageTimers: [],
  pageAbort: null,
  approvals: [],
  seenApprovals: new Set(),
  approvalTimer: null,
  /** AudioContext for the approval chime, made on the sign-in gesture (browsers allow
   * sound only after one); null = silent. */
  audio: null,
};

// ---------------------------------------------------------------------------------
// Helpers

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') e.addEventListener(k.slice(2), v);
    else if (k === 'class') e.className = v;
    else if (v === true) e.setAttribute(k, '');
    else e.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

const $ = (id) => document.getElementById(id);
const enc = encodeURIComponent;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function signedIn() {
  return sessionStorage.getItem(TOKEN_KEY) !== null;
}

function authHeaders() {
  const t = sessionStorage.getItem(TOKEN_KEY);
  return t ? { Authorization: 'Bearer ' + t } : {};
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message || code || ('HTTP ' + status));
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, body) {
  const headers = authHeaders();
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: 'no-store',
    credentials: 'omit',
  });
  let data = null;
  try {
    data = await r.json();
  } catch (_) {
    data = null;
  }
  if (r.status === 401 && signedIn() && state.me) {
    signOut('The server no longer accepts your token; sign in again.');
  }
  if (!r.ok) {
    const err = (data && data.error) || {};
    throw new ApiError(r.status, err.code, err.message);
  }
  return data;
}

function toast(text) {
  const t = $('toast');
  t.textContent = text;
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, TOAST_MS);
}

function fmtDuration(ms) {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return s + 's';
  const m = Math.floor(s / 60);
  if (m < 60) return m + 'm ' + String(s % 60).padStart(2, '0') + 's';
  const h = Math.floor(m / 60);
  if (h < 48) return h + 'h ' + String(m % 60).padStart(2, '0') + 'm';
  return Math.floor(h / 24) + 'd ' + (h % 24) + 'h';
}

function fmtTime(ms) {
  return ms ? new Date(ms).toLocaleString() : '';
}

function pretty(v) {
  try {
    return typeof v === 'string' ? v : JSON.stringify(v, null, 2);
  } catch (_) {
    return String(v);
  }
}

function oneLine(v, max) {
  const s = (typeof v === 'string' ? v : JSON.stringify(v)) || '';
  return s.length > max ? s.slice(0, max) + '…' : s;
}

function capName(c) {
  return typeof c === 'string' ? c : Object.keys(c || {})[0] || '?';
}

function statusCell(status) {
  return el('span', { class: 'status status-' + status }, status);
}

/** Keeps `tbody`'s rows keyed by id: rows are updated in place, so focus survives a refresh. */
function syncRows(tbody, items, keyOf, build, update) {
  const existing = new Map();
  for (const tr of Array.from(tbody.children)) existing.set(tr.dataset.key, tr);
  const wanted = [];
  for (const item of items) {
    const key = keyOf(item);
    let tr = existing.get(key);
    if (!tr) {
      tr = build(item);
      tr.dataset.key = key;
    }
    update(tr, item);
    existing.delete(key);
    wanted.push(tr);
  }
  for (const tr of existing.values()) tr.remove();
  wanted.forEach((tr, i) => {
    if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null);
  });
}

function table(headers, cls) {
  const tbody = el('tbody');
  const t = el('table', { class: 'responsive ' + (cls || '') },
    el('thead', {}, el('tr', {}, headers.map((h) => el('th', { scope: 'col' }, h)))), tbody);
  return { wrap: el('div', { class: 'scroll' }, t), tbody, headers };
}

function cells(tr, headers, values) {
  // One <td> per header, labelled for the narrow layout; values are text or nodes.
  while (tr.children.length < headers.length) tr.append(el('td', { 'data-label': headers[tr.children.length] }));
  values.forEach((v, i) => {
    const td = tr.children[i];
    if (v instanceof Node) {
      if (td.firstChild !== v) td.replaceChildren(v);
    } else {
      const text = v === null || v === undefined ? '' : String(v);
      if (td.textContent !== text || td.children.length) td.textContent = text;
    }
  });
}

function every(ms, fn) {
  fn();
  state.pageTimers.push(setInterval(fn, ms));
}

function pageError(e) {
  return el('p', { class: 'error', role: 'alert' }, e.message || String(e));
}

// ---------------------------------------------------------------------------------
// Sign-in and navigation

function showSignIn(message) {
  $('sign-in').hidden = false;
  $('nav').hidden = true;
  $('sign-out').hidden = true;
  $('who').textContent = '';
  $('page').replaceChildren();
  $('sign-in-error').textContent = message || '';
  $('token').focus();
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  state.me = null;
  stopPage();
  clearInterval(state.approvalTimer);
  state.approvalTimer = null;
  document.title = 'warden';
  showSignIn(message);
}

async function signIn(tokenValue) {
  sessionStorage.setItem(TOKEN_KEY, tokenValue);
  try {
    state.me = await api('GET', '/v1/me');
  } catch (e) {
    sessionStorage.removeItem(TOKEN_KEY);
    state.me = null;
    showSignIn(e.status === 401 ? 'This token is not accepted.' : e.message);
    return;
  }
  $('sign-in').hidden = true;
  $('nav').hidden = false;
  $('sign-out').hidden = false;
  $('who').textContent = state.me.name + ' (' + state.me.role + ')';
  for (const a of document.querySelectorAll('#nav [data-admin]')) a.hidden = state.me.role !== 'admin';
  startApprovalWatch();
  route();
}

function isAdmin() {
  return state.me && state.me.role === 'admin';
}

function stopPage() {
  for (const t of state.pageTimers) clearInterval(t);
  state.pageTimers = [];
  if (state.pageAbort) state.pageAbort.abort();
  state.pageAbort = null;
}

function route() {
  if (!state.me) return;
  stopPage();
  state.pageAbort = new AbortController();
  const parts = (location.hash || '#/tasks').replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  const page = parts[0] || 'tasks';
  for (const a of document.querySelectorAll('#nav a')) {
    if (a.dataset.page === page) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  const root = $('page');
  root.replaceChildren();
  const pages = { tasks: parts[1] ? () => taskPage(root, parts[1]) : () => tasksPage(root),
    approvals: () => approvalsPage(root), plugins: () => pluginsPage(root),
    sessions: () => sessionsPage(root), audit: () => auditPage(root) };
  (pages[page] || pages.tasks)();
}

// ---------------------------------------------------------------------------------
// Approvals (watched on every page: title badge, notice, answers)

function startApprovalWatch() {
  clearInterval(state.approvalTimer);
  const tick = async () => {
    try {
      const r = await api('GET', '/v1/approvals');
      state.approvals = r.approvals || [];
    } catch (_) {
      return;
    }
    const n = state.approvals.length;
    const badge = $('approval-count');
    badge.textContent = String(n);
    badge.hidden = n === 0;
    document.title = n ? '(' + n + ') warden — approval waiting' : 'warden';
    for (const a of state.approvals) {
      if (!state.seenApprovals.has(a.id)) {
        state.seenApprovals.add(a.id);
        toast('Approval waiting: ' + a.tool + ' from ' + (a.subagent || 'a subagent'));
        chime();
      }
    }
    document.dispatchEvent(new CustomEvent('warden:approvals'));
  };
  tick();
  state.approvalTimer = setInterval(tick, APPROVAL_POLL_MS);
}

/** A short tone when an approval arrives (the console may be in a background tab).
 * Silent when the browser gave no audio (signed in without a gesture, or no device). */
function chime() {
  const ctx = state.audio;
  if (!ctx || ctx.state !== 'running') return;
  const osc = ctx.createOscillator();
  const gain = ctx.createGain();
  osc.frequency.value = 880;
  gain.gain.setValueAtTime(0.08, ctx.currentTime);
  gain.gain.exponentialRampToValueAtTime(0.0001, ctx.currentTime + 0.3);
  osc.connect(gain).connect(ctx.destination);
  osc.start();
  osc.stop(ctx.currentTime + 0.3);
}

/** Approve / decline controls for one pending request. */
function decisionControls(a, onDone) {
  const scopes = (a.scopes && a.scopes.length) ? a.scopes : ['once'];
  const scope = el('select', { 'aria-label': 'Approval scope for ' + a.id, 'data-scope': a.id },
    scopes.map((s) => el('option', { value: s }, s)));
  const decide = async (decision, buttons) => {
    buttons.forEach((b) => { b.disabled = true; });
    try {
      await api('POST', '/v1/approvals/' + enc(a.id), { decision, scope: decision === 'approve' ? scope.value : 'once' });
      toast((decision === 'approve' ? 'Approved ' : 'Declined ') + a.tool);
      if (onDone) onDone(decision);
    } catch (e) {
      toast('Could not decide: ' + e.message);
      buttons.forEach((b) => { b.disabled = false; });
    }
  };
  const approve = el('button', { type: 'button', 'data-approve': a.id });
  const decline = el('button', { type: 'button', class: 'danger', 'data-decline': a.id });
  approve.textContent = 'Approve';
  decline.textContent = 'Decline';
  approve.addEventListener('click', () => decide('approve', [approve, decline]));
  decline.addEventListener('click', () => decide('decline', [approve, decline]));
  return el('div', { class: 'row' }, el('label', { class: 'meta' }, 'scope ', scope), approve, decline);
}

function approvalCard(a, withTaskLink) {
  return el('div', { class: 'approval', 'data-approval': a.id },
    el('div', {}, el('strong', {}, (a.chain || []).map((l) => l.subagent).concat([a.subagent || 'a subagent']).join(' › ')),
      ' wants to run ', el('strong', {}, a.tool)),
    el('pre', {}, pretty(a.input)),
    el('div', { class: 'meta' },
      'rule: ', a.matched_rule || 'default', ' · ', a.reason || '',
      a.user_id ? ' · user ' + a.user_id : '', a.principal ? ' · principal ' + a.principal : '',
      a.expires_at ? ' · expires ' + a.expires_at : ''),
    withTaskLink && a.task_id ? el('div', { class: 'meta' }, 'task ', el('a', { href: '#/tasks/' + enc(a.task_id) }, a.task_id)) : null,
    decisionControls(a, null));
}

function approvalsPage(root) {
  const list = el('div', { id: 'approval-list' });
  root.append(el('h1', {}, 'Approvals'), list);
  const render = () => {
    const items = state.approvals;
    const keep = new Map(Array.from(list.children).map((c) => [c.dataset.approval, c]));
    if (!items.length) {
      list.replaceChildren(el('p', { class: 'empty' }, 'No tool call is waiting for a decision.'));
      return;
    }
    for (const c of Array.from(list.children)) if (!c.dataset.approval) c.remove();
    for (const a of items) {
      if (!keep.has(a.id)) list.append(approvalCard(a, true));
      keep.delete(a.id);
    }
    for (const c of keep.values()) c.remove();
  };
  render();
  const onUpdate = () => render();
  document.addEventListener('warden:approvals', onUpdate);
  state.pageAbort.signal.addEventListener('abort', () => document.removeEventListener('warden:approvals', onUpdate));
}

// ---------------------------------------------------------------------------------
// Tasks

function elapsed(t) {
  return fmtDuration((t.finished_at_ms || Date.now()) - t.created_at_ms);
}

function tasksPage(root) {
  const t = table(['Task', 'Status', 'Subagent', 'Plugin', 'Principal', 'User', 'Elapsed', 'Started']);
  const err = el('div');
  const empty = el('p', { class: 'empty', hidden: true }, 'No tasks yet.');
  root.append(el('h1', {}, 'Tasks'), err, t.wrap, empty);
  const tasks = new Map();
  /** Keeps the newer of two versions of a task (a pushed change may beat the list). */
  const keep = (x) => {
    const had = tasks.get(x.task_id);
    if (!had || (x.updated_at_ms || 0) >= (had.updated_at_ms || 0)) tasks.set(x.task_id, x);
  };
  const render = () => {
    const list = Array.from(tasks.values())
      .sort((a, b) => (b.created_at_ms - a.created_at_ms) || (a.task_id < b.task_id ? 1 : -1))
      .slice(0, MAX_TASK_ROWS);
    empty.hidden = list.length > 0;
    syncRows(t.tbody, list, (x) => x.task_id,
      (x) => el('tr', { 'data-task': x.task_id }),
      (tr, x) => {
        let link = tr.querySelector('a');
        if (!link) link = el('a', { href: '#/tasks/' + enc(x.task_id) });
        link.textContent = x.description || x.task_id;
        cells(tr, t.headers, [link, statusCell(x.status), x.subagent_type, (x.plugin && x.plugin.id) || '',
          x.principal || '', x.user_id, elapsed(x), fmtTime(x.created_at_ms)]);
      });
  };
  const load = async () => {
    try {
      const r = await api('GET', '/v1/tasks');
      (r.tasks || []).forEach(keep);
      err.replaceChildren();
      render();
    } catch (e) {
      err.replaceChildren(pageError(e));
    }
  };
  // Changes are pushed (GET /v1/tasks/changes); the list is read once the feed is open,
  // so nothing between the two is missed, and again whenever the feed says it lagged or
  // reconnects.
  const signal = state.pageAbort.signal;
  (async () => {
    while (!signal.aborted) {
      try {
        await readSse('/v1/tasks/changes', 0, signal, load, (ev) => {
          if (ev.type === 'resync') load();
          else if (ev.type === 'task' && ev.task) {
            keep(ev.task);
            render();
          }
        });
      } catch (e) {
        if (signal.aborted) return;
        err.replaceChildren(pageError(e));
      }
      await sleep(RECONNECT_MS);
    }
  })();
  // Elapsed times of running tasks move on without the server.
  state.pageTimers.push(setInterval(render, TICK_MS));
}

function workspacePath(p) {
  return String(p || '').replace(/^\/workspace\//, '').replace(/^\.\//, '');
}

function taskPage(root, id) {
  const head = el('div', { class: 'card' });
  const stream = el('div', { class: 'stream', id: 'stream' });
  const filesList = el('ul', { class: 'files', id: 'files' });
  const filesNone = el('p', { class: 'empty' }, 'No files written yet.');
  const cancel = el('button', { type: 'button', class: 'danger', id: 'cancel' });
  cancel.textContent = 'Cancel task';
  root.append(el('p', {}, el('a', { href: '#/tasks' }, '← Tasks')), head,
    el('h2', {}, 'Events'), stream, el('h2', {}, 'Files'), filesNone, filesList);
  const ctx = { stream, tools: new Map(), approvals: new Map(), current: null, currentKind: null,
    files: new Map(), record: null };

  const renderHead = (rec) => {
    ctx.record = rec;
    cancel.disabled = !!rec.finished_at_ms;
    head.replaceChildren(
      el('div', { class: 'row' }, el('h1', {}, rec.description || rec.task_id), el('span', { class: 'spacer' }), cancel),
      el('div', { class: 'meta' }, statusCell(rec.status), ' · ', rec.subagent_type,
        rec.plugin ? ' · plugin ' + rec.plugin.id + ' ' + rec.plugin.version : '',
        ' · user ', rec.user_id, rec.principal ? ' · principal ' + rec.principal : '',
        ' · session ', el('span', { class: 'mono' }, rec.session_id), ' · ', elapsed(rec)),
      el('div', { class: 'meta mono' }, rec.task_id,
        rec.parent_task_id ? el('span', {}, ' · started by ', el('a', { href: '#/tasks/' + enc(rec.parent_task_id) }, rec.parent_task_id)) : null));
  };
  cancel.addEventListener('click', async () => {
    cancel.disabled = true;
    try {
      renderHead(await api('POST', '/v1/tasks/' + enc(id) + '/cancel'));
      toast('Task canceled');
    } catch (e) {
      toast('Could not cancel: ' + e.message);
    }
  });

  const refreshFiles = () => {
    filesNone.hidden = ctx.files.size > 0;
    for (const [path, f] of ctx.files) {
      if (f.node || !f.ok) continue;
      const btn = el('button', { type: 'button', class: 'secondary', 'data-download': path });
      btn.textContent = 'Download';
      btn.addEventListener('click', () => download(ctx.record, path));
      f.node = el('li', {}, el('span', { class: 'mono' }, path), ' ', btn);
      filesList.append(f.node);
    }
  };

  const signal = state.pageAbort.signal;
  (async () => {
    try {
      renderHead(await api('GET', '/v1/tasks/' + enc(id) + '?block=false'));
    } catch (e) {
      head.replaceChildren(pageError(e.status === 404 ? new Error('No task ' + id + ' (or not yours).') : e));
      return;
    }
    await followEvents(id, signal, (ev) => {
      renderEvent(ctx, ev);
      if (ev.type === 'tool_result' || ev.type === 'tool_call') refreshFiles();
      if (ev.type === 'status' || ev.type === 'finish') {
        api('GET', '/v1/tasks/' + enc(id) + '?block=false').then(renderHead, () => {});
      }
    });
  })();
  every(POLL_MS, () => { if (ctx.record && !ctx.record.finished_at_ms) renderHead(ctx.record); });
}

/** Reads one Server-Sent Events response from `path` (fetch, so the token goes as a
 * header, never in a URL or cookie): `onOpen()` once the server accepted, then
 * `onEvent(event, id)` per JSON event (heartbeats skipped) until the stream ends or
 * `onEvent` returns false. Throws ApiError when the server refuses. */
async function readSse(path, lastId, signal, onOpen, onEvent) {
  const headers = authHeaders();
  headers.Accept = 'text/event-stream';
  if (lastId) headers['Last-Event-ID'] = String(lastId);
  const r = await fetch(path, { headers, signal, cache: 'no-store', credentials: 'omit' });
  if (!r.ok) throw new ApiError(r.status);
  if (onOpen) onOpen();
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true }).replace(/\r\n/g, '\n');
    let cut;
    while ((cut = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      let data = '';
      let id = 0;
      for (const line of block.split('\n')) {
        if (line.startsWith('id:')) id = Number(line.slice(3).trim()) || 0;
        else if (line.startsWith('data:')) data += line.slice(5).replace(/^ /, '');
      }
      if (!data) continue;
      let ev;
      try {
        ev = JSON.parse(data);
      } catch (_) {
        continue;
      }
      if (ev.type === 'heartbeat') continue;
      if (onEvent(ev, id) === false) {
        reader.cancel().catch(() => {});
        return;
      }
    }
  }
}

/** Follows the task's event stream, reconnecting with Last-Event-ID, until its
 * `finish` event or `signal`. */
async function followEvents(id, signal, onEvent) {
  let last = 0;
  let finished = false;
  while (!signal.aborted && !finished) {
    try {
      await readSse('/v1/tasks/' + enc(id) + '/events', last, signal, null, (ev, seq) => {
        if (seq) last = seq;
        onEvent(ev);
        finished = ev.type === 'finish';
        return !finished;
      });
    } catch (e) {
      if (signal.aborted) return;
      if (e instanceof ApiError && e.status === 404) return;
    }
    if (!finished) await sleep(RECONNECT_MS);
  }
}

function line(ctx, text, cls) {
  ctx.current = null;
  ctx.stream.append(el('div', { class: cls || 'line' }, text));
}

function renderEvent(ctx, ev) {
  switch (ev.type) {
    case 'token':
    case 'reasoning': {
      const kind = ev.type === 'token' ? 'text' : 'reasoning';
      if (!ctx.current || ctx.currentKind !== kind) {
        ctx.current = el('div', { class: kind });
        ctx.currentKind = kind;
        ctx.stream.append(ctx.current);
      }
      ctx.current.append(ev.text || '');
      break;
    }
    case 'tool_call': {
      ctx.current = null;
      const status = el('span', { class: 'meta' }, ' …');
      const d = el('details', { class: 'tool', 'data-tool-call': ev.id },
        el('summary', {}, el('strong', {}, ev.name), ' ', el('span', { class: 'mono' }, oneLine(ev.input, 80)), status),
        el('div', { class: 'meta' }, 'arguments'), el('pre', {}, pretty(ev.input)));
      d.statusNode = status;
      ctx.tools.set(ev.id, d);
      ctx.stream.append(d);
      const input = ev.input || {};
      const path = input.file_path || input.notebook_path;
      if (WRITING_TOOLS.includes(ev.name) && path) ctx.files.set(workspacePath(path), { ok: false, call: ev.id });
      break;
    }
    case 'tool_result': {
      ctx.current = null;
      let d = ctx.tools.get(ev.id);
      if (!d) {
        d = el('details', { class: 'tool' }, el('summary', {}, el('strong', {}, ev.name || 'tool')));
        ctx.stream.append(d);
      }
      d.append(el('div', { class: 'meta' }, ev.is_error ? 'error' : 'result'), el('pre', {}, ev.content || ''));
      if (d.statusNode) d.statusNode.textContent = ev.is_error ? ' ✗ failed' : ' ✓';
      if (ev.is_error) d.classList.add('tool-error');
      for (const f of ctx.files.values()) if (f.call === ev.id) f.ok = !ev.is_error;
      break;
    }
    case 'approval_request': {
      ctx.current = null;
      const pending = state.approvals.some((a) => a.id === ev.id) || !ev.expires_at || Date.parse(ev.expires_at) > Date.now();
      // A long input comes cut in the event (`input_cut`): the whole call is in the
      // approvals list, and only a call seen whole is offered for a decision.
      const whole = state.approvals.find((a) => a.id === ev.id);
      const shown = ev.input_cut ? (whole ? pretty(whole.input) : pretty(ev.input) + '\n… cut: ' + ev.input_length
        + ' characters in all; the Approvals page shows the whole call') : pretty(ev.input);
      const card = el('div', { class: 'approval', 'data-approval': ev.id },
        el('div', {}, 'Waiting for approval: ', el('strong', {}, ev.tool)),
        el('pre', {}, shown),
        el('div', { class: 'meta' }, 'rule: ', ev.matched_rule || 'default', ' · ', ev.reason || ''));
      const controls = pending && (!ev.input_cut || whole) ? decisionControls(ev, null) : null;
      if (controls) card.append(controls);
      card.controls = controls;
      ctx.approvals.set(ev.id, card);
      ctx.stream.append(card);
      break;
    }
    case 'approval_resolved': {
      const card = ctx.approvals.get(ev.request_id);
      const text = ev.decision + (ev.decided_by ? ' by ' + ev.decided_by : '');
      if (card) {
        card.classList.add('resolved');
        if (card.controls) card.controls.remove();
        card.append(el('div', { class: 'meta', 'data-resolved': ev.request_id }, 'Decision: ', text));
      } else {
        line(ctx, 'approval ' + text);
      }
      break;
    }
    case 'status':
      line(ctx, 'status: ' + ev.status);
      break;
    case 'plugin':
      line(ctx, 'plugin ' + ev.id + ' ' + (ev.version || '') + (ev.sha256 ? ' (sha256 ' + ev.sha256.slice(0, 12) + '…)' : ''));
      break;
    case 'error':
      line(ctx, 'error: ' + (ev.message || ''), 'error');
      break;
    case 'finish': {
      ctx.current = null;
      const box = el('div', { class: 'card finish', id: 'finish' },
        el('div', {}, 'Finished: ', statusCell(ev.status), ev.reason ? ' (' + ev.reason + ')' : ''));
      if (ev.output) box.append(el('div', { class: 'text' }, ev.output));
      if (ev.error) box.append(el('div', { class: 'error' }, ev.error));
      ctx.stream.append(box);
      break;
    }
    default:
      line(ctx, '· ' + (ev.message || (ev.type + ' ' + oneLine(ev, 200))));
  }
}

async function download(rec, path) {
  if (!rec) return;
  const url = '/v1/sessions/' + enc(rec.session_id) + '/files/' + path.split('/').map(enc).join('/') +
    '?user_id=' + enc(rec.user_id);
  try {
    const r = await fetch(url, { headers: authHeaders(), cache: 'no-store', credentials: 'omit' });
    if (!r.ok) {
      let msg = 'HTTP ' + r.status;
      try { msg = (await r.json()).error.message; } catch (_) { /* not JSON */ }
      throw new Error(msg);
    }
    const blob = await r.blob();
    const href = URL.createObjectURL(blob);
    const a = el('a', { href, download: path.split('/').pop() || 'file' });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(href), 60000);
  } catch (e) {
    toast('Download failed: ' + e.message);
  }
}

// ---------------------------------------------------------------------------------
// Plugins

function pluginsPage(root) {
  const t = table(['Plugin', 'State', 'Kinds', 'Granted', 'SHA-256', 'Signature', 'Problems']);
  const err = el('div');
  const empty = el('p', { class: 'empty', hidden: true }, 'No plugins in the plugin directory.');
  root.append(el('h1', {}, 'Plugins'), el('p', { class: 'hint' }, 'Refreshes every 2 s: files dropped into or removed from the plugin directory show here.'),
    err, t.wrap, empty);
  every(POLL_MS, async () => {
    let r;
    try {
      r = await api('GET', '/v1/plugins');
      err.replaceChildren();
    } catch (e) {
      err.replaceChildren(pageError(e));
      return;
    }
    const plugins = r.plugins || [];
    empty.hidden = plugins.length > 0;
    syncRows(t.tbody, plugins, (p) => p.id, (p) => el('tr', { 'data-plugin': p.id }), (tr, p) => {
      const kinds = (p.kinds || []).join(', ') +
        ((p.shadowed_kinds || []).length ? ' (shadowed: ' + p.shadowed_kinds.join(', ') + ')' : '');
      const problems = [p.error,
        (p.ambiguous_kinds || []).length ? 'kinds ' + p.ambiguous_kinds.join(', ') + ' are served by none (set plugins.priority)' : null,
        p.tier === 'baseline' ? 'optimised build compiling' : null].filter(Boolean).join('; ');
      const granted = (p.granted_capabilities || []).map(capName).join(', ') +
        ((p.http_allow || []).length ? ' · http: ' + p.http_allow.join(', ') : '');
      const signature = !p.signature ? '—' :
        p.signature.state === 'signed' ? 'signed by ' + String(p.signature.key || '').slice(0, 16) + '…' : 'unsigned';
      cells(tr, t.headers, [p.id + ' ' + (p.version || '') + (p.name && p.name !== p.id ? ' (' + p.name + ')' : ''),
        statusCell(p.state), kinds, granted || 'nothing', p.sha256 || '', signature, problems]);
      tr.children[4].className = 'mono';
    });
  });
}

// ---------------------------------------------------------------------------------
// Sessions (admins)

function adminOnly(root, title) {
  root.append(el('h1', {}, title), el('p', { class: 'empty' }, 'Only admins see this page.'));
}

function sessionsPage(root) {
  if (!isAdmin()) return adminOnly(root, 'Sessions');
  const t = table(['Session', 'User', 'State', 'Age', 'Idle', 'Container', 'Runtime', 'Docker host', '']);
  const err = el('div');
  const empty = el('p', { class: 'empty', hidden: true }, 'No sandbox sessions.');
  root.append(el('h1', {}, 'Sessions'), err, t.wrap, empty);
  const refresh = async () => {
    let r;
    try {
      r = await api('GET', '/v1/sessions');
      err.replaceChildren();
    } catch (e) {
      err.replaceChildren(pageError(e));
      return;
    }
    const rows = r.sessions || [];
    empty.hidden = rows.length > 0;
    syncRows(t.tbody, rows, (s) => s.user_id + '/' + s.session_id + '/' + (s.runtime || ''), (s) => {
      const tr = el('tr', { 'data-session': s.session_id });
      const end = el('button', { type: 'button', class: 'danger', 'data-end': s.session_id });
      end.textContent = 'End';
      end.addEventListener('click', async () => {
        end.disabled = true;
        try {
          await api('POST', '/v1/sessions/' + enc(s.session_id) + '/end?user_id=' + enc(s.user_id));
          toast('Ended session ' + s.session_id);
          refresh();
        } catch (e) {
          toast('Could not end: ' + e.message);
          end.disabled = false;
        }
      });
      // Pause stops the container (no process survives) and keeps the workspace; Resume
      // (or the session's next call) starts it again.
      const toggle = el('button', { type: 'button', 'data-pause': s.session_id });
      toggle.addEventListener('click', async () => {
        const action = toggle.dataset.action;
        toggle.disabled = true;
        try {
          await api('POST', '/v1/sessions/' + enc(s.session_id) + '/' + action + '?user_id=' + enc(s.user_id));
          toast((action === 'pause' ? 'Paused' : 'Resumed') + ' session ' + s.session_id);
          refresh();
        } catch (e) {
          toast('Could not ' + action + ': ' + e.message);
        }
        toggle.disabled = false;
      });
      tr.endButton = end;
      tr.pauseButton = toggle;
      tr.actions = el('span', { class: 'actions' }, toggle, end);
      return tr;
    }, (tr, s) => {
      tr.pauseButton.dataset.action = s.paused ? 'resume' : 'pause';
      tr.pauseButton.textContent = s.paused ? 'Resume' : 'Pause';
      tr.pauseButton.hidden = !s.owned_here;
      cells(tr, t.headers, [s.session_id, s.user_id, s.paused ? 'paused' : s.state, fmtDuration(s.age_secs * 1000),
        s.idle_secs === null || s.idle_secs === undefined ? '—' : fmtDuration(s.idle_secs * 1000),
        s.container, s.runtime || '', s.docker_host || '', tr.actions]);
    });
  };
  every(POLL_MS, refresh);
}

// ---------------------------------------------------------------------------------
// Audit (admins)

function auditPage(root) {
  if (!isAdmin()) return adminOnly(root, 'Audit');
  const text = el('input', { type: 'search', id: 'audit-filter', placeholder: 'tool, task, rule, who…', 'aria-label': 'Filter' });
  const decision = el('select', { id: 'audit-decision', 'aria-label': 'Decision' },
    ['', 'allow', 'deny', 'approve', 'decline', 'timeout', 'bypass'].map((d) => el('option', { value: d }, d || 'any decision')));
  const t = table(['Time', 'Decision', 'Tool', 'Subagent', 'Task', 'Rule', 'Decided by', 'Waited']);
  const note = el('p', { class: 'empty', hidden: true });
  const err = el('div');
  root.append(el('h1', {}, 'Audit'), el('div', { class: 'filters' }, text, decision), err, t.wrap, note);
  let records = [];
  let configured = true;
  const render = () => {
    const q = text.value.trim().toLowerCase();
    const d = decision.value;
    const shown = records.filter((r) => (!d || r.decision === d) && (!q || JSON.stringify(r).toLowerCase().includes(q)));
    note.hidden = shown.length > 0;
    note.textContent = configured ? 'No matching decisions.' : 'No audit log is configured (approval.audit_log).';
    syncRows(t.tbody, shown, (r) => r.ts + '|' + (r.request_id || '') + '|' + r.args_sha256 + '|' + r.tool,
      () => el('tr'),
      (tr, r) => cells(tr, t.headers, [r.ts, r.decision || r.kind || '', r.tool || r.host || '', r.subagent || '',
        r.task_id || '', r.rule || '', r.decided_by || '', r.waited_ms === undefined ? '' : r.waited_ms + ' ms']));
  };
  text.addEventListener('input', render);
  decision.addEventListener('change', render);
  every(POLL_MS, async () => {
    try {
      const r = await api('GET', '/v1/audit');
      records = r.records || [];
      configured = r.configured !== false;
      err.replaceChildren();
      render();
    } catch (e) {
      err.replaceChildren(pageError(e));
    }
  });
}

// ---------------------------------------------------------------------------------
// Start

document.addEventListener('DOMContentLoaded', () => {
  $('sign-in-form').addEventListener('submit', (e) => {
    // The sign-in is a user gesture: the one moment a page may start audio.
    if (!state.audio && window.AudioContext) {
      try {
        state.audio = new AudioContext();
      } catch (_) {
        state.audio = null;
      }
    }
    e.preventDefault();
    const value = $('token').value.trim();
    $('token').value = '';
    signIn(value);
  });
  $('sign-out').addEventListener('click', () => signOut(''));
  window.addEventListener('hashchange', route);
  if (signedIn()) signIn(sessionStorage.getItem(TOKEN_KEY));
  else showSignIn('');
});
