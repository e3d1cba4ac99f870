// Sessions: the daemon's sessions with their live counters (GET /daemon/status, polled), and a
// form that creates one (POST /session).

import { getJson, postJson } from '../api.js';
import { h, render } from '../dom.js';
import { bytes, doing, exact, human, shortId } from '../format.js';
import { refreshEvery } from '../refresh.js';

function stateBadge(row) {
  const { text, cls } = doing(row);
  return h('span', { class: ['badge', cls], 'data-testid': 'session-state' }, text);
}

function sessionRows(sessions) {
  if (!sessions.length) {
    return h('tr', {}, h('td', { colspan: 8, class: 'empty' }, 'No sessions yet: create one below.'));
  }
  return sessions.map((s) => h('tr', { 'data-session': s.sessionId },
    h('th', { scope: 'row' }, h('a', { href: `#/session/${encodeURIComponent(s.sessionId)}`, class: 'mono',
      title: s.sessionId }, shortId(s.sessionId))),
    h('td', {}, stateBadge(s)),
    h('td', { class: 'num' }, exact(s.pendingPrompts)),
    h('td', { class: 'num' }, exact(s.pendingPermissions)),
    h('td', { class: 'num' }, exact(s.subscribers)),
    h('td', { class: 'num' }, exact(s.lastEventId)),
    h('td', { class: ['num', s.framesDropped ? 'bad' : null] }, exact(s.framesDropped)),
    h('td', { class: ['num', s.lostBytes ? 'bad' : null], title: s.lostBytes ? bytes(s.lostBytes) : null },
      s.lostBytes === undefined ? '—' : exact(s.lostBytes))));
}

function figures(status) {
  const pipe = status.runtime?.perf?.pipe || {};
  const sidecars = status.sidecars;
  const items = [
    ['pipe frames in / out', `${exact(pipe.inbound?.count ?? 0)} / ${exact(pipe.outbound?.count ?? 0)}`],
    ['largest inbound frame', human(pipe.inbound?.maxBytes ?? 0)],
    ['large frames logged / suppressed', `${exact(status.largeFrames?.logged ?? 0)} / ${exact(status.largeFrames?.suppressed ?? 0)}`],
    ['frames dropped', exact(status.framesDropped ?? 0)],
    ['SSE evictions', exact(status.sse?.evictions ?? 0)],
  ];
  if (sidecars) {
    items.push(['sidecars', `${exact(sidecars.count ?? 0)} · ${human(sidecars.bytes ?? 0)}`]);
    items.push(['kept off the wire', human(sidecars.bytesKeptOffWire ?? 0)]);
  }
  return h('dl', { class: 'figures' }, items.map(([label, value]) => h('div', {}, h('dt', {}, label), h('dd', {}, value))));
}

function createForm(ctx) {
  const error = h('p', { class: 'error', role: 'alert' });
  const cwd = h('input', { id: 'new-cwd', name: 'cwd', required: true, placeholder: '/path/to/project',
    autocomplete: 'off', spellcheck: 'false', 'data-testid': 'new-session-cwd' });
  const profile = h('input', { id: 'new-profile', name: 'profile', placeholder: "the agent's default",
    pattern: '[A-Za-z0-9_.\\-]+', maxlength: 64, autocomplete: 'off', spellcheck: 'false',
    'data-testid': 'new-session-profile' });
  const mode = h('select', { id: 'new-mode', name: 'permissionMode', 'data-testid': 'new-session-mode' },
    h('option', { value: '' }, "the agent's default"),
    h('option', { value: 'auto' }, 'auto: approve every tool call'),
    h('option', { value: 'ask' }, 'ask: I answer each permission request'));
  const scripted = h('textarea', { id: 'new-scripted', name: 'scripted', rows: 2, spellcheck: 'false',
    placeholder: '{"iterations": 4}', 'data-testid': 'new-session-scripted' });
  const submit = h('button', { type: 'submit', class: 'primary' }, 'Create session');
  const form = h('form', { class: 'card create', 'aria-labelledby': 'create-title' },
    h('h2', { id: 'create-title' }, 'New session'),
    h('div', { class: 'fields' },
      h('div', {}, h('label', { for: 'new-cwd' }, 'Working directory (absolute)'), cwd),
      h('div', {}, h('label', { for: 'new-profile' }, 'Profile'), profile),
      h('div', {}, h('label', { for: 'new-mode' }, 'Tool permissions'), mode)),
    h('details', {}, h('summary', {}, 'Scripted model hints (the offline model only)'),
      h('label', { for: 'new-scripted' }, 'JSON object, as `hopline run --scripted`'), scripted),
    h('div', { class: 'actions' }, submit),
    error);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    error.textContent = '';
    const body = { cwd: cwd.value.trim() };
    if (profile.value.trim()) body.profile = profile.value.trim();
    if (mode.value) body.permissionMode = mode.value;
    if (scripted.value.trim()) {
      try {
        body.scripted = JSON.parse(scripted.value);
      } catch (exc) {
        error.textContent = `Scripted hints: not JSON (${exc.message})`;
        return;
      }
    }
    submit.disabled = true;
    submit.textContent = 'Starting the agent…';
    try {
      const created = await postJson('/session', body);
      ctx.navigate(`session/${encodeURIComponent(created.sessionId)}`);
    } catch (exc) {
      error.textContent = exc.message;
    } finally {
      submit.disabled = false;
      submit.textContent = 'Create session';
    }
  });
  return form;
}

export default {
  id: 'sessions',
  title: 'Sessions',
  nav: true,
  match: (route) => (route === 'sessions' ? {} : null),
  mount(root, ctx) {
    const body = h('tbody');
    const summary = h('div', { class: 'summary', 'aria-live': 'off' });
    const note = h('p', { class: 'hint', role: 'status' });
    render(root,
      h('h1', {}, 'Sessions'),
      summary,
      h('section', { class: 'card', 'data-testid': 'sessions', 'aria-labelledby': 'sessions-title' },
        h('h2', { id: 'sessions-title', class: 'visually-hidden' }, 'Sessions of this daemon'),
        h('div', { class: 'table-wrap' }, h('table', {},
          h('thead', {}, h('tr', {},
            h('th', { scope: 'col' }, 'session'), h('th', { scope: 'col' }, 'state'),
            h('th', { scope: 'col', class: 'num' }, 'pending prompts'),
            h('th', { scope: 'col', class: 'num' }, 'pending permissions'),
            h('th', { scope: 'col', class: 'num' }, 'subscribers'),
            h('th', { scope: 'col', class: 'num' }, 'last event id'),
            h('th', { scope: 'col', class: 'num' }, 'frames dropped'),
            h('th', { scope: 'col', class: 'num' }, 'lost bytes'))),
          body)),
        note),
      createForm(ctx));
    return refreshEvery(async () => {
      const status = await getJson('/daemon/status');
      render(body, sessionRows(status.sessions || []));
      render(summary, figures(status));
    }, note);
  },
};
