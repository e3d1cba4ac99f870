// Gate runs (SPEC K): the daemon's runs (GET /gate, polled) with a form that starts one
// (POST /gate), and one run live (GET /gate/{id}/events): one table per round, a row per gate agent
// with its item, iteration, compactions, largest body against the ceiling, 413s, verdict and
// findings; each dev fix with its commit and how it was verified; the dev session's states. The
// event types are the daemon's own names (GET /gate/vocabulary), never spelled here.

import { clientSseOptions, getJson, postJson } from '../api.js';
import { h, render } from '../dom.js';
import { exact, human, shortId } from '../format.js';
import { refreshEvery } from '../refresh.js';
import { EventStream } from '../sse.js';

const VERDICT_CLASS = { pass: 'state-ready', fail: 'state-detached', error: 'state-detached' };

function badge(text, cls) {
  return h('span', { class: ['badge', cls] }, text || '…');
}

function itemBadge(item) {
  const cls = item === 'gate_passed' ? 'state-ready' : item === 'gate_failed' || item === 'gate_error'
    ? 'state-detached' : 'state-starting';
  return badge(item, cls);
}

function runRows(runs) {
  if (!runs.length) {
    return h('tr', {}, h('td', { colspan: 6, class: 'empty' }, 'No gate run yet: start one below.'));
  }
  return runs.map((run) => h('tr', { 'data-gate': run.gateId },
    h('th', { scope: 'row' }, h('a', { href: `#/gate/${encodeURIComponent(run.gateId)}`, class: 'mono',
      title: run.gateId }, shortId(run.gateId.slice(2)))),
    h('td', {}, badge(run.state, run.state === 'done' ? 'state-ready' : 'state-starting')),
    h('td', { class: 'num' }, run.exitCode === null || run.exitCode === undefined ? '—' : String(run.exitCode)),
    h('td', { class: 'num' }, exact(run.round)),
    h('td', {}, run.devState || '—'),
    h('td', {}, Object.keys(run.items || {}).map((agent) => h('span', { class: 'gate-chip' }, `${agent}: `,
      badge(run.verdicts?.[agent] || run.items[agent], VERDICT_CLASS[run.verdicts?.[agent]] || 'state-starting'))))));
}

function startForm(ctx) {
  const error = h('p', { class: 'error', role: 'alert' });
  const repo = h('input', { id: 'gate-repo', required: true, placeholder: '/path/to/repository', autocomplete: 'off',
    spellcheck: 'false', 'data-testid': 'gate-repo' });
  const base = h('input', { id: 'gate-base', placeholder: 'merge base with main', autocomplete: 'off',
    spellcheck: 'false', 'data-testid': 'gate-base' });
  const head = h('input', { id: 'gate-head', placeholder: 'HEAD', autocomplete: 'off', spellcheck: 'false',
    'data-testid': 'gate-head' });
  const fix = h('input', { id: 'gate-fix', type: 'checkbox', 'data-testid': 'gate-fix' });
  const submit = h('button', { type: 'submit', class: 'primary' }, 'Start gate run');
  const form = h('form', { class: 'card create', 'aria-labelledby': 'gate-start-title' },
    h('h2', { id: 'gate-start-title' }, 'New gate run'),
    h('div', { class: 'fields' },
      h('div', {}, h('label', { for: 'gate-repo' }, 'Repository (absolute path)'), repo),
      h('div', {}, h('label', { for: 'gate-base' }, 'Base'), base),
      h('div', {}, h('label', { for: 'gate-head' }, 'Head'), head)),
    h('label', { for: 'gate-fix', class: 'check' }, fix, ' fix: a dev agent works on the findings, then the gate runs again'),
    h('div', { class: 'actions' }, submit),
    error);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    error.textContent = '';
    const body = { repo: repo.value.trim(), fix: fix.checked };
    if (base.value.trim()) body.base = base.value.trim();
    if (head.value.trim()) body.head = head.value.trim();
    submit.disabled = true;
    try {
      const started = await postJson('/gate', body);
      ctx.navigate(`gate/${encodeURIComponent(started.gateId)}`);
    } catch (exc) {
      error.textContent = exc.message;
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}

class GateRunView {
  constructor(root, gateId) {
    this.gateId = gateId;
    this.rows = new Map(); // agent -> {row, cells, findings}
    this.streamLine = h('p', { class: 'stream', role: 'status', 'data-testid': 'gate-stream' }, 'connecting…');
    this.head = h('p', { class: 'hint', 'data-testid': 'gate-head-line' });
    this.dev = h('p', { 'data-testid': 'gate-dev', class: 'hint' });
    this.result = h('p', { 'data-testid': 'gate-result', 'aria-live': 'polite' });
    this.rounds = h('div', { class: 'gate-rounds' });
    this.fixes = h('ul', { class: 'gate-fixes', 'data-testid': 'gate-fixes' });
    this.sandbox = h('p', { class: 'hint', 'data-testid': 'gate-sandbox' });
    this.body = null;
    render(root,
      h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' }, h('a', { href: '#/gates' }, 'Gate runs'), ' › ',
        h('span', { class: 'mono' }, shortId(gateId.slice(2)))),
      h('h1', {}, 'Gate run ', h('span', { class: 'mono', title: gateId }, shortId(gateId.slice(2)))),
      this.streamLine, this.head, this.sandbox, this.dev,
      h('section', { class: 'card', 'data-testid': 'gate-agents', 'aria-label': 'Gate agents, by round' }, this.rounds),
      this.fixes,
      this.result);
  }

  newRound(number, head) {
    // A round's table stays when the next one starts: every round, the fix between them, is shown.
    this.body = h('tbody');
    this.rows = new Map();
    this.rounds.append(h('div', { class: 'table-wrap', 'data-round': String(number) },
      h('h2', {}, `Round ${number} · head ${shortId(head)}`),
      h('table', {},
        h('thead', {}, h('tr', {},
          ['gate', 'item', 'iteration', 'compactions', 'largest body / ceiling', '413s', 'verdict', 'findings']
            .map((c) => h('th', { scope: 'col' }, c)))),
        this.body)));
  }

  async start() {
    this.ev = (await getJson('/gate/vocabulary')).events;
    const status = await getJson('/daemon/status');
    const budget = status.budget || {};
    this.stream = new EventStream(`/gate/${encodeURIComponent(this.gateId)}/events`, {
      ...clientSseOptions(budget),
      onEvent: (event) => this.onEvent(event),
      onState: (state) => {
        if (state.kind === 'live' || state.kind === 'resumed') this.streamLine.textContent = `live · ${exact(state.replayed)} events replayed`;
        else if (state.kind === 'reconnecting') this.streamLine.textContent = `reconnecting (attempt ${state.attempt} of ${state.of})…`;
        else if (state.kind === 'failed') this.streamLine.textContent = `stream stopped: ${state.error}`;
      },
    });
    this.stream.start();
  }

  stop() {
    if (this.stream) this.stream.stop();
  }

  row(agent) {
    if (!this.body) this.newRound(1, '');
    let entry = this.rows.get(agent);
    if (!entry) {
      const cells = {
        item: h('td', {}), iteration: h('td', { class: 'num' }, '0'), compactions: h('td', { class: 'num' }, '0'),
        body: h('td', { class: 'num' }, '—'), http413s: h('td', { class: 'num' }, '0'),
        verdict: h('td', { 'data-testid': 'gate-verdict' }, '…'), findings: h('td', {}),
      };
      const row = h('tr', { 'data-agent': agent }, h('th', { scope: 'row' }, agent), cells.item, cells.iteration,
        cells.compactions, cells.body, cells.http413s, cells.verdict, cells.findings);
      this.body.append(row);
      entry = { row, cells };
      this.rows.set(agent, entry);
    }
    return entry;
  }

  onEvent(event) {
    const data = event.data || {};
    const ev = this.ev;
    switch (event.type) {
      case ev.GATE_STARTED:
        this.head.textContent = `base ${shortId(data.base)} (${data.baseFrom}) · head ${shortId(data.head)} · `
          + (data.nothingToReview || (data.fix ? `fix, up to ${data.rounds} rounds` : 'no fix'));
        if (data.sandbox) {
          this.sandbox.textContent = `sandbox: ${data.sandbox.kind} · test command: `
            + (data.testCommand ? `${data.testCommand.shown} (${data.testCommand.source})` : 'none found');
        }
        break;
      case ev.GATE_ROUND:
        this.newRound(data.round, data.head);
        break;
      case ev.GATE_FIX:
        this.fixes.append(h('li', { 'data-testid': 'gate-fix', 'data-ok': String(Boolean(data.commit)),
          class: data.commit ? 'good' : 'bad' },
          `dev fix after round ${data.round}: `
          + (data.commit ? `commit ${data.commit} · verified: ${data.reason}` : `fix_failed: ${data.reason}`)));
        break;
      case ev.GATE_ITEM: {
        const { cells, row } = this.row(data.agent);
        render(cells.item, itemBadge(data.item));
        row.dataset.item = data.item;
        break;
      }
      case ev.GATE_PROGRESS: {
        const { cells } = this.row(data.agent);
        cells.iteration.textContent = `${data.iteration}/${data.maxIterations}`;
        cells.compactions.textContent = exact(data.compactions);
        cells.body.textContent = `${human(data.maxBodyBytes)} / ${human(data.ceilingBytes)}`;
        cells.http413s.textContent = exact(data.http413s);
        break;
      }
      case ev.GATE_VERDICT:
        this.verdict(data);
        break;
      case ev.DEV_STATE:
        this.dev.textContent = `dev session ${shortId(data.devSessionId)}: ${data.previous} → ${data.state} (${data.event})`;
        this.dev.dataset.state = data.state;
        break;
      case ev.GATE_COMPLETE: {
        const result = data.result || {};
        this.result.className = result.exitCode === 0 ? 'good' : 'bad';
        this.result.textContent = `${result.state} · exit ${result.exitCode}`
          + (result.nothingToReview ? ` · ${result.nothingToReview}` : '')
          + (result.devStates?.length ? ` · dev session ${[result.devStates[0].previous, ...result.devStates.map((c) => c.state)].join(' → ')}` : '')
          + (result.error ? ` · ${result.error}` : '');
        this.result.dataset.exit = String(result.exitCode);
        break;
      }
      default:
        break;
    }
  }

  verdict(data) {
    const { cells, row } = this.row(data.agent);
    row.dataset.verdict = data.verdict;
    render(cells.verdict, badge(data.verdict, VERDICT_CLASS[data.verdict]));
    cells.http413s.textContent = exact(data.http413s);
    cells.iteration.textContent = `${data.iterations}/${data.maxIterations}`;
    cells.compactions.textContent = exact(data.compactions);
    render(cells.findings, (data.findings || []).length
      ? h('ul', { class: 'findings' }, data.findings.map((f) => h('li', { 'data-rule': f.rule, class: f.severity === 'error' ? 'bad' : 'warn' },
        `${f.severity} · ${f.file}${f.line ? `:${f.line}` : ''} · ${f.rule}: ${f.message}`)))
      : h('span', { class: 'hint' }, data.verdict === 'error' ? data.summary : `no finding · ${data.summary || ''}`));
  }
}

export default {
  id: 'gates',
  title: 'Gate runs',
  nav: true,
  match: (route) => {
    if (route === 'gates') return { list: true };
    const m = /^gate\/(g_[0-9a-f]+)$/.exec(route);
    return m ? { gateId: decodeURIComponent(m[1]) } : null;
  },
  mount(root, ctx, params) {
    if (params.gateId) {
      const view = new GateRunView(root, params.gateId);
      view.start().catch((exc) => { view.streamLine.textContent = `Could not start: ${exc.message}`; });
      return () => view.stop();
    }
    const body = h('tbody');
    const note = h('p', { class: 'hint', role: 'status' });
    render(root,
      h('h1', {}, 'Gate runs'),
      h('section', { class: 'card', 'data-testid': 'gate-runs', 'aria-label': 'Gate runs of this daemon' },
        h('div', { class: 'table-wrap' }, h('table', {},
          h('thead', {}, h('tr', {}, ['run', 'state', 'exit', 'round', 'dev session', 'gates'].map((c) => h('th', { scope: 'col' }, c)))),
          body)),
        note),
      startForm(ctx));
    return refreshEvery(async () => {
      render(body, runRows((await getJson('/gate')).gates || []));
    }, note);
  },
};
