// One session, live: the agent's text as it streams, tool calls with their status and sidecars,
// compactions, the progress line, permission requests, the prompt box; the stream resumes with
// Last-Event-ID after a dropped connection and says so.

import { clientSseOptions, getJson, postJson, sessionPath } from '../api.js';
import { h, render } from '../dom.js';
import { amount, bytes, count, doing, exact, human, shortId, tokens } from '../format.js';
import { fetchVerified, fileName, saveBytes, sidecarEntries } from '../sidecars.js';
import { refreshEvery } from '../refresh.js';
import { EventStream } from '../sse.js';
import { rawEventItem } from '../raw.js';

const OUTPUT_CHARS_SHOWN = 4000; // of a tool's inline output; the rest stays a click away
const TEXT_KINDS = { agent_message_chunk: 'agent', agent_thought_chunk: 'thought', user_message_chunk: 'user' };
const ALLOW_KINDS = new Set(['allow_once', 'allow_always']);
const REJECT_KINDS = new Set(['reject_once', 'reject_always']);
// Events after which the session does something else (the badge: running, awaiting permission, idle).
const BADGE_EVENTS = new Set(['permission_request', 'permission_resolved', 'turn_complete', 'turn_error',
  'session_reaped']);

/** Text of an ACP content block, a list of blocks or a tool-call content entry. */
function contentText(content) {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) return content.map(contentText).join('');
  if (content && typeof content === 'object') {
    if (content.type === 'text' && typeof content.text === 'string') return content.text;
    if (content.type === 'content') return contentText(content.content);
  }
  return '';
}

function statusBadge(status) {
  return h('span', { class: ['badge', `status-${status || 'pending'}`] }, status || 'pending');
}

function meter(value, max, label) {
  const fill = h('span', { class: 'fill' });
  const ratio = max > 0 ? Math.min(1, value / max) : 0;
  fill.style.width = `${(ratio * 100).toFixed(1)}%`;
  if (ratio >= 0.9) fill.classList.add('hot');
  return h('span', { class: 'meter', role: 'img', 'aria-label': label }, fill);
}


// One attached file as an ACP content block.
async function fileBlock(file) {
  if (file.type.startsWith('image/')) {
    const data = new Uint8Array(await file.arrayBuffer());
    let binary = '';
    for (let i = 0; i < data.length; i += 0x8000) binary += String.fromCharCode(...data.subarray(i, i + 0x8000));
    return { type: 'image', mimeType: file.type, data: btoa(binary) };
  }
  return { type: 'resource', resource: { uri: `file:///${encodeURIComponent(file.name)}`,
    mimeType: file.type || 'text/plain', text: await file.text() } };
}

class SessionView {
  constructor(root, sessionId) {
    this.root = root;
    this.sessionId = sessionId;
    this.stream = null;
    this.prompts = new Map(); // promptId -> {header, progress, maxBody, compactions, permissions:[]}
    this.tools = new Map(); // toolCallId -> card
    this.lastText = null; // {promptId, kind, el}: where the next text chunk goes
    this.stopPolling = null;
    this.stopped = false;
    this.build();
  }

  build() {
    this.badge = h('span', { class: 'badge', 'data-testid': 'session-state' }, '…');
    this.counters = h('span', { class: 'hint' });
    this.loadButton = h('button', { type: 'button', hidden: true, onclick: () => this.load() }, 'Load (restart the agent)');
    this.streamLine = h('p', { class: 'stream', role: 'status', 'data-testid': 'stream-status' }, 'connecting…');
    this.progressLine = h('div', { class: 'progress', 'data-testid': 'progress' }, h('span', { class: 'hint' }, 'no turn yet'));
    this.log = h('div', { class: 'events', role: 'log', tabindex: 0, 'aria-label': 'Session events',
      'data-testid': 'session-events' });
    this.input = h('textarea', { id: 'prompt', rows: 3, required: true, 'data-testid': 'prompt-input',
      placeholder: 'Ask the agent… (Ctrl+Enter sends)' });
    // Enabled once the history is in: a prompt sent before would show above the events it follows.
    this.sendButton = h('button', { type: 'submit', class: 'primary', 'data-testid': 'send', disabled: true }, 'Send');
    this.cancelButton = h('button', { type: 'button', 'data-testid': 'cancel', onclick: () => this.cancel() }, 'Cancel turn');
    this.formNote = h('p', { class: 'hint', role: 'status' });
    // Attached files go as ACP content blocks: an image file as an image block, any other as an
    // embedded resource (its text): the browser knows no path the agent could read a link from.
    this.attach = h('input', { type: 'file', id: 'prompt-attach', multiple: true, 'data-testid': 'prompt-attach' });
    const form = h('form', { class: 'prompt-box', 'aria-label': 'Prompt' },
      h('label', { for: 'prompt', class: 'visually-hidden' }, 'Prompt'),
      this.input,
      h('div', { class: 'actions' }, h('label', { for: 'prompt-attach', class: 'hint' }, 'Attach files '),
        this.attach, this.sendButton, this.cancelButton, this.formNote));
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      this.send();
    });
    this.input.addEventListener('keydown', (event) => {
      if (event.key === 'Enter' && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        this.send();
      }
    });
    render(this.root,
      h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' }, h('a', { href: '#/sessions' }, 'Sessions'), ' › ',
        h('span', { class: 'mono' }, shortId(this.sessionId))),
      h('div', { class: 'session-head' },
        h('h1', {}, 'Session ', h('span', { class: 'mono', title: this.sessionId }, shortId(this.sessionId))),
        this.badge, this.counters, this.loadButton),
      this.streamLine,
      this.progressLine,
      this.log,
      form);
  }

  async start() {
    let budget = {};
    try {
      const status = await getJson('/daemon/status');
      budget = status.budget || {};
      this.showStatus(status);
    } catch (exc) {
      render(this.streamLine, `Could not read the daemon status: ${exc.message} `,
        h('button', { type: 'button', onclick: () => this.start() }, 'Retry'));
      return;
    }
    if (this.stopped) return;
    this.streamOptions = {
      ...clientSseOptions(budget),
      onEvent: (event) => this.onEvent(event),
      onState: (state) => this.onState(state),
    };
    this.openStream(0);
    if (!this.stopPolling) this.stopPolling = refreshEvery(() => this.refreshStatus());
  }

  stop() {
    this.stopped = true;
    if (this.stopPolling) this.stopPolling();
    if (this.stream) this.stream.stop();
  }

  /** The badge follows what the session does: asked again soon after an event that changes it (one
   *  request for a burst of them), besides the regular polling. */
  refreshSoon() {
    if (this.refreshPending || this.stopped) return;
    this.refreshPending = true;
    setTimeout(() => {
      this.refreshPending = false;
      this.refreshStatus();
    }, 100);
  }

  async refreshStatus() {
    try {
      this.showStatus(await getJson('/daemon/status'));
    } catch {
      // the stream line already says when the daemon is gone
    }
  }

  showStatus(status) {
    const row = (status.sessions || []).find((s) => s.sessionId === this.sessionId);
    if (!row) return;
    const { text, cls } = doing(row);
    render(this.badge, text);
    this.badge.className = `badge ${cls}`;
    this.counters.textContent = `${count(row.pendingPrompts, 'pending prompt')} · `
      + `${count(row.pendingPermissions, 'pending permission')} · ${count(row.subscribers, 'subscriber')} · `
      + `frames dropped ${exact(row.framesDropped)}`
      + (row.lostBytes !== undefined ? ` · lost ${exact(row.lostBytes)} B` : '');
    this.loadButton.hidden = row.state !== 'detached';
  }

  // --- the stream ------------------------------------------------------------------------------

  onState(state) {
    const line = this.streamLine;
    line.className = 'stream';
    switch (state.kind) {
      case 'connecting':
        line.textContent = state.resuming ? `reconnecting with Last-Event-ID ${state.lastEventId}…` : 'connecting…';
        break;
      case 'live':
        this.sendButton.disabled = false;
        this.liveText = `live · ${count(state.replayed, 'event')} replayed`;
        this.showLastId();
        this.refreshStatus(); // this page is a subscriber now
        break;
      case 'resumed':
        this.liveText = `live · resumed with Last-Event-ID ${state.after}: ${count(state.replayed, 'missed event')} replayed`;
        line.classList.add('resumed');
        this.showLastId();
        this.refreshStatus();
        this.note('resume', `Connection resumed with Last-Event-ID ${state.after}: `
          + `${count(state.replayed, 'missed event')} replayed, none shown twice.`);
        break;
      case 'reconnecting':
        line.classList.add('warn');
        line.textContent = `connection lost after event ${state.lastEventId}; reconnecting in ${state.delaySeconds} s `
          + `(attempt ${state.attempt} of ${state.of})`;
        if (state.attempt === 1) this.note('drop', `Connection dropped after event ${state.lastEventId}.`);
        break;
      case 'failed':
        line.classList.add('bad');
        render(line, `stream stopped: ${state.error} `, h('button', { type: 'button', onclick: () => this.reconnect() }, 'Reconnect'));
        break;
      default:
        break;
    }
  }

  showLastId() {
    if (this.stream && this.liveText) this.streamLine.textContent = `${this.liveText} · last event id ${this.stream.lastEventId}`;
  }

  /** A stream from just after `lastEventId` (0: the whole history), resuming as a drop would. */
  openStream(lastEventId) {
    this.stream = new EventStream(sessionPath(this.sessionId, 'events'), this.streamOptions);
    this.stream.lastEventId = lastEventId;
    this.stream.drops = lastEventId > 0 ? 1 : 0;
    this.stream.start();
  }

  reconnect() {
    const after = this.stream.lastEventId;
    this.stream.stop();
    this.openStream(after);
  }

  onEvent(event) {
    const stick = this.log.scrollHeight - this.log.scrollTop - this.log.clientHeight < 40;
    try {
      this.renderEvent(event);
    } catch (error) {
      // A malformed event (an agent's update of any shape) never stops the stream: it is shown as
      // the daemon sent it, escaped (text, never markup), with a note, and the next event follows.
      this.append(rawEventItem(event, error));
      console.warn('event not rendered', event.type, error && error.name);
    }
    this.showLastId();
    if (stick) this.log.scrollTop = this.log.scrollHeight;
    if (BADGE_EVENTS.has(event.type)) this.refreshSoon();
  }

  renderEvent(event) {
    const data = event.data || {};
    switch (event.type) {
      case 'session_update': this.onUpdate(data.promptId ?? null, data.update || {}); break;
      case 'progress': this.onProgress(data.promptId, data.progress || {}); break;
      case 'compaction': this.onCompaction(data.promptId, data.compaction || {}); break;
      case 'permission_request': this.onPermission(data); break;
      case 'permission_resolved': this.onPermissionResolved(data); break;
      case 'turn_complete': this.onTurnEnd(data, false); break;
      case 'turn_error': this.onTurnEnd(data, true); break;
      case 'frame_dropped':
        this.item('warn', `Frame dropped on ${data.hop || 'the pipe'}: ${bytes(data.bytes || 0)}`
          + (data.limit !== undefined ? ` over the limit of ${amount(data.limit, data.unit)}${data.setting ? ` (${data.setting})` : ''}` : '')
          + ` · ${data.reason}`);
        break;
      case 'sidecar_delayed':
        this.item('warn', `A large update (${bytes(data.bytes || 0)}) waits for its sidecar store; `
          + `it follows when stored, or degraded past ${data.timeoutSeconds} s per request (${data.setting}).`);
        break;
      case 'replay_complete': break;
      case 'slow_client_warning': this.item('warn', 'The daemon warns that this page reads its events slowly.'); break;
      case 'client_evicted': this.item('warn', 'The daemon evicted this stream (reading too slowly); resuming with Last-Event-ID.'); break;
      case 'state_resync_required':
        render(this.log);
        this.prompts.clear();
        this.tools.clear();
        this.lastText = null;
        this.item('warn', 'The daemon asked for a reload of this session: replaying it from the start.');
        this.stream.restartFromZero();
        break;
      case 'stream_error': this.item('bad', data.message || 'The event stream failed.'); break;
      case 'session_reaped': this.item('warn', data.message || 'The daemon stopped this idle session\'s agent.'); break;
      default: this.item('dim', `event ${event.type}`); break;
    }
  }

  // --- timeline items --------------------------------------------------------------------------

  append(el) {
    this.log.append(el);
    this.lastText = null;
    return el;
  }

  item(kind, text) {
    return this.append(h('p', { class: ['item', kind] }, text));
  }

  note(kind, text) {
    const stick = this.log.scrollHeight - this.log.scrollTop - this.log.clientHeight < 40;
    this.append(h('p', { class: ['item', 'divider', kind], 'data-testid': `stream-${kind}` }, text));
    if (stick) this.log.scrollTop = this.log.scrollHeight;
  }

  prompt(promptId, text) {
    if (!promptId) return null;
    let state = this.prompts.get(promptId);
    if (!state) {
      const header = this.append(h('div', { class: 'item prompt', 'data-prompt': promptId },
        h('span', { class: 'label' }, 'prompt'), ' ', h('span', { class: 'mono hint' }, promptId),
        text ? h('p', { class: 'prompt-text' }, text) : null));
      state = { header, maxBody: 0, compactions: [], permissions: [], progress: null, ended: false };
      this.prompts.set(promptId, state);
    }
    return state;
  }

  onUpdate(promptId, update) {
    this.prompt(promptId);
    const kind = update.sessionUpdate;
    const dropped = update._meta && update._meta['hopline.dropped'];
    if (TEXT_KINDS[kind]) {
      this.onText(promptId, TEXT_KINDS[kind], contentText(update.content), update);
    } else if (kind === 'tool_call' || kind === 'tool_call_update') {
      this.onTool(update);
    } else if (kind === 'plan') {
      this.onPlan(promptId, update.entries || []);
    } else if (kind === 'available_commands_update') {
      this.item('dim', `The agent offers ${exact((update.availableCommands || []).length)} commands.`);
    } else {
      this.item('dim', `update ${kind}`);
    }
    if (dropped && !TEXT_KINDS[kind]) {
      this.item('bad', `An update of ${bytes(dropped.bytes)} passed the limit of ${amount(dropped.limit, dropped.unit)} `
        + `on ${dropped.hop}: its payload was not relayed.`);
    }
  }

  onText(promptId, kind, text, update) {
    const entries = sidecarEntries(update);
    const last = this.lastText;
    if (!entries.length && last && last.promptId === promptId && last.kind === kind) {
      last.el.append(text);
      return;
    }
    const el = h('div', { class: ['item', 'text', kind] });
    const block = h('div', { class: 'text-body' }, text);
    el.append(block);
    if (entries.length) el.append(this.sidecarPanel(entries));
    this.log.append(el);
    this.lastText = entries.length ? null : { promptId, kind, el: block };
  }

  onTool(update) {
    const id = update.toolCallId || `anonymous-${this.tools.size}`;
    let card = this.tools.get(id);
    if (!card) {
      card = {
        el: h('article', { class: 'item tool', 'data-tool-call-id': id }),
        title: '', kind: '', status: 'pending', output: '', sidecars: [],
      };
      this.tools.set(id, card);
      this.append(card.el);
    }
    if (typeof update.title === 'string') card.title = update.title;
    if (typeof update.kind === 'string') card.kind = update.kind;
    if (typeof update.status === 'string') card.status = update.status;
    const entries = sidecarEntries(update);
    if (entries.length) card.sidecars = entries;
    if (Array.isArray(update.content)) {
      const moved = new Set(entries.map((e) => e.field));
      card.output = update.content.filter((_, i) => !moved.has(`content[${i}].text`)).map(contentText).join('\n');
    }
    const dropped = update._meta && update._meta['hopline.dropped'];
    if (dropped) card.dropped = dropped;
    this.renderTool(card);
  }

  renderTool(card) {
    const output = card.output.length > OUTPUT_CHARS_SHOWN
      ? [h('pre', { class: 'output' }, card.output.slice(0, OUTPUT_CHARS_SHOWN)),
        h('p', { class: 'hint' }, `${exact(card.output.length - OUTPUT_CHARS_SHOWN)} more characters not shown`)]
      : card.output ? h('pre', { class: 'output' }, card.output) : null;
    render(card.el,
      h('header', {}, statusBadge(card.status), h('span', { class: 'tool-title' }, card.title || 'tool call'),
        card.kind ? h('span', { class: 'hint' }, card.kind) : null),
      output,
      card.dropped ? h('p', { class: 'bad' }, `Output of ${bytes(card.dropped.bytes)} passed the limit of `
        + `${amount(card.dropped.limit, card.dropped.unit)} on ${card.dropped.hop}: not relayed.`) : null,
      card.sidecars.length ? this.sidecarPanel(card.sidecars) : null);
    card.el.dataset.status = card.status;
  }

  sidecarPanel(entries) {
    return h('div', { class: 'sidecars' }, entries.map((entry) => this.sidecarRow(entry)));
  }

  sidecarRow(entry) {
    const result = h('span', { class: 'verify', role: 'status' });
    const head = [h('strong', { class: 'mono' }, entry.field || 'field'), ' · ', bytes(entry.bytes), ' · ', entry.mediaType];
    if (!entry.resolvable) {
      return h('div', { class: 'sidecar truncated', 'data-testid': 'sidecar' },
        h('p', {}, head, ' · ', h('span', { class: 'bad' },
          `truncated${entry.reason ? ` (${entry.reason})` : ''}: only a preview reached the client; `
          + `${exact(entry.bytes)} bytes are lost`)),
        this.previewOf(entry));
    }
    const button = h('button', { type: 'button', 'data-testid': 'sidecar-download' }, 'Download and verify sha256');
    button.addEventListener('click', async () => {
      button.disabled = true;
      result.className = 'verify';
      result.textContent = 'downloading…';
      try {
        const { data, sha256 } = await fetchVerified(this.sessionId, entry);
        saveBytes(data, entry.mediaType, fileName(entry));
        result.classList.add('good');
        result.textContent = `✓ ${exact(data.length)} bytes, sha256 verified (${sha256.slice(0, 16)}…)`;
      } catch (exc) {
        result.classList.add('bad');
        result.textContent = `✗ ${exc.message}`;
      } finally {
        button.disabled = false;
      }
    });
    return h('div', { class: 'sidecar', 'data-testid': 'sidecar', 'data-sidecar-id': entry.id },
      h('p', {}, head, ' · sha256 ', h('code', { title: entry.sha256 }, `${entry.sha256.slice(0, 12)}…`)),
      this.previewOf(entry),
      h('div', { class: 'actions' }, button, result));
  }

  previewOf(entry) {
    if (!entry.head && !entry.tail) return null;
    const shown = new TextEncoder().encode(entry.head + entry.tail).length;
    return h('details', { class: 'preview' },
      h('summary', {}, `Preview: head and tail (${human(shown)} of ${human(entry.bytes)})`),
      h('pre', { class: 'output head' }, entry.head),
      h('p', { class: 'marker' }, `… ${exact(Math.max(0, entry.bytes - shown))} bytes `
        + `${entry.resolvable ? 'in the sidecar' : 'not delivered'} …`),
      h('pre', { class: 'output tail' }, entry.tail));
  }

  onPlan(promptId, entries) {
    const state = this.prompt(promptId);
    const list = h('ol', { class: 'plan' }, entries.map((e) => h('li', { class: `plan-${e.status}` },
      statusBadge(e.status), ' ', e.content)));
    if (state && state.plan) render(state.plan, h('span', { class: 'label' }, 'plan'), list);
    else {
      const el = this.append(h('div', { class: 'item plan-card' }, h('span', { class: 'label' }, 'plan'), list));
      if (state) state.plan = el;
    }
  }

  onProgress(promptId, progress) {
    const state = this.prompt(promptId) || { maxBody: 0, compactions: [] };
    state.progress = progress;
    state.maxBody = Math.max(state.maxBody, progress.bodyBytes || 0);
    this.renderProgress(state);
  }

  renderProgress(state) {
    const p = state.progress || {};
    const triggers = [...new Set(state.compactions.map((c) => c.trigger))].sort();
    const ceiling = p.ceilingBytes || 0;
    render(this.progressLine,
      h('span', {}, `iteration ${p.iteration ?? '?'}/${p.maxIterations ?? '?'}`),
      h('span', {}, `estimate ${tokens(p.estimateTokens)} / ${tokens(p.effectiveWindowTokens)} tokens `,
        meter(p.estimateTokens || 0, p.effectiveWindowTokens || 0, 'estimate against the effective window')),
      h('span', {}, `compactions ${state.compactions.length}${triggers.length ? ` (${triggers.join(', ')})` : ''}`),
      h('span', {}, `largest body ${human(state.maxBody)} / ${human(ceiling)} ceiling `,
        meter(state.maxBody, ceiling, 'largest body against the engine ceiling')));
  }

  onCompaction(promptId, record) {
    const state = this.prompt(promptId);
    if (state) {
      state.compactions.push(record);
      this.renderProgress(state);
    }
    const parts = [`trigger ${record.trigger}`,
      `replaced ${count(record.messagesReplaced ?? 0, 'message')} / ${bytes(record.bytesReplaced ?? 0)}`,
      `body ${human(record.bytesBefore ?? 0)} → ${human(record.bytesAfter ?? 0)}`];
    if (record.summarizer) parts.push(`summarizer ${record.summarizer}`);
    const el = this.append(h('div', { class: 'item compaction', 'data-testid': 'compaction' },
      h('span', { class: 'label' }, '⟲ compaction'), ' ', parts.join(' · ')));
    if (record.summarizerError) el.append(h('p', { class: 'warn' }, `summarizer error: ${record.summarizerError}`));
    if (record.reason) el.append(h('p', { class: 'warn' }, record.reason));
  }

  // Answered here, by another client, by a cancel or a deadline: every reader sees it closed.
  onPermissionResolved(data) {
    const el = this.log.querySelector(`[data-request="${CSS.escape(String(data.requestId))}"]`);
    if (!el) return;
    el.classList.add('answered');
    el.querySelectorAll('button').forEach((b) => { b.disabled = true; });
    const outcome = data.outcome?.optionId ?? data.outcome?.outcome ?? '?';
    el.querySelector('.outcome').textContent = `resolved by ${data.resolvedBy}: ${outcome}`;
  }

  onPermission(data) {
    const state = this.prompt(data.promptId);
    const outcome = h('span', { class: 'outcome', role: 'status' });
    const buttons = [];
    const answer = async (body, label) => {
      buttons.forEach((b) => { b.disabled = true; });
      outcome.textContent = 'answering…';
      try {
        await postJson(sessionPath(this.sessionId, 'permission', data.requestId), body);
        outcome.textContent = `answered: ${label}`;
        el.classList.add('answered');
      } catch (exc) {
        outcome.textContent = exc.status === 404 ? 'no longer pending' : exc.message;
        if (exc.status !== 404) buttons.forEach((b) => { b.disabled = false; });
      }
    };
    const options = Array.isArray(data.options) ? data.options : [];
    for (const option of options) {
      const allow = ALLOW_KINDS.has(option.kind);
      const deny = REJECT_KINDS.has(option.kind);
      const label = option.name || option.optionId;
      buttons.push(h('button', { type: 'button', class: allow ? 'allow' : deny ? 'deny' : null,
        'data-testid': allow ? 'permission-allow' : deny ? 'permission-deny' : 'permission-option',
        onclick: () => answer({ optionId: option.optionId }, label) }, label));
    }
    if (!options.some((o) => REJECT_KINDS.has(o.kind))) {
      buttons.push(h('button', { type: 'button', class: 'deny', 'data-testid': 'permission-deny',
        onclick: () => answer({ outcome: 'reject' }, 'deny') }, 'Deny'));
    }
    const call = data.toolCall || {};
    const el = this.append(h('div', { class: 'item permission', 'data-testid': 'permission-request',
      'data-request': String(data.requestId) },
      h('p', {}, h('span', { class: 'label' }, 'permission'), ' The agent asks to run ',
        h('strong', {}, call.title || call.toolCallId || 'a tool'), call.kind ? ` (${call.kind})` : ''),
      h('div', { class: 'actions' }, buttons, outcome)));
    if (state) state.permissions.push({ buttons, outcome, el });
    if (state && state.ended) this.closePermissions(state);
  }

  closePermissions(state) {
    for (const p of state.permissions) {
      if (p.el.classList.contains('answered')) continue;
      p.buttons.forEach((b) => { b.disabled = true; });
      if (!p.outcome.textContent) p.outcome.textContent = 'the turn has ended';
    }
  }

  onTurnEnd(data, failed) {
    const state = this.prompt(data.promptId);
    if (state) {
      state.ended = true;
      this.closePermissions(state);
    }
    if (failed) {
      const parts = [`origin ${data.origin}`];
      if (data.hop) parts.push(`hop ${data.hop}`);
      if (data.limit !== undefined) parts.push(`limit ${amount(data.limit, data.unit)}`);
      if (data.observed !== undefined) parts.push(`observed ${amount(data.observed, data.unit)}`);
      if (data.reason) parts.push(data.reason);
      this.append(h('div', { class: 'item turn-end bad', 'data-testid': 'turn-error' },
        h('span', { class: 'label' }, 'turn failed'), ' ', parts.join(' · '),
        data.message ? h('p', {}, data.message) : null));
      return;
    }
    const turn = data.turn || {};
    const parts = [`stop reason ${data.stopReason}`];
    if (turn.iterations !== undefined) parts.push(count(turn.iterations, 'iteration'));
    if (turn.compactions !== undefined) parts.push(count(turn.compactions, 'compaction'));
    if (turn.maxBodyBytes) parts.push(`largest body ${human(turn.maxBodyBytes)} / ${human(turn.ceilingBytes || 0)}`);
    const lost = data.lostBytes ?? turn.lostBytes;
    const degraded = data.degraded ?? turn.degraded;
    const el = this.append(h('div', { class: ['item', 'turn-end', degraded ? 'bad' : 'good'], 'data-testid': 'turn-complete' },
      h('span', { class: 'label' }, 'turn complete'), ' ', parts.join(' · ')));
    if (degraded || lost) {
      el.append(h('p', { class: 'bad' }, `degraded: ${bytes(lost || 0)} lost (not deliverable to the client)`));
    } else if (lost === 0) {
      el.append(h('span', { class: 'hint' }, ' · nothing lost'));
    }
  }

  // --- actions ---------------------------------------------------------------------------------

  async send() {
    const text = this.input.value;
    if (!text.trim() || this.sendButton.disabled) return;
    this.sendButton.disabled = true;
    this.formNote.textContent = '';
    try {
      const files = [...(this.attach.files || [])];
      const body = files.length ? { prompt: [{ type: 'text', text }, ...await Promise.all(files.map(fileBlock))] }
        : { text };
      const { promptId } = await postJson(sessionPath(this.sessionId, 'prompt'), body);
      this.input.value = '';
      this.attach.value = '';
      if (!this.prompts.has(promptId)) this.prompt(promptId, text);
      else this.prompts.get(promptId).header.append(h('p', { class: 'prompt-text' }, text));
      this.refreshSoon(); // running now
      this.log.scrollTop = this.log.scrollHeight;
    } catch (exc) {
      this.formNote.textContent = exc.message;
    } finally {
      this.sendButton.disabled = false;
    }
  }

  async cancel() {
    this.formNote.textContent = '';
    try {
      const { cancelled } = await postJson(sessionPath(this.sessionId, 'cancel'));
      this.formNote.textContent = cancelled ? 'Cancelling the running turn…' : 'No turn was running.';
    } catch (exc) {
      this.formNote.textContent = exc.message;
    }
  }

  async load() {
    this.loadButton.disabled = true;
    try {
      const result = await postJson(sessionPath(this.sessionId, 'load'));
      this.formNote.textContent = `Loaded from the ${result.source}: ${exact(result.replayedUpdates)} updates replayed.`;
    } catch (exc) {
      this.formNote.textContent = exc.message;
    } finally {
      this.loadButton.disabled = false;
    }
  }
}

export default {
  id: 'session',
  title: 'Session',
  nav: false,
  navAs: 'sessions',
  match(route) {
    const m = /^session\/([^/]+)$/.exec(route);
    return m ? { sessionId: decodeURIComponent(m[1]) } : null;
  },
  mount(root, ctx, { sessionId }) {
    const view = new SessionView(root, sessionId);
    view.start();
    return () => view.stop();
  },
};
