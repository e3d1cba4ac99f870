// The budget chain: every byte ceiling of `hopline limits` as a bar on one log scale, in exact
// bytes, hop by hop in the budget's own order, the narrowest request ceiling marked; the other
// ceilings (tokens, counts, seconds, ratios) in a table; the coherence findings.

import { getJson } from '../api.js';
import { logAxis } from '../chart.js';
import { h, render } from '../dom.js';
import { exact, human } from '../format.js';

function groupByHop(ceilings) {
  const hops = new Map();
  for (const c of ceilings) {
    if (!hops.has(c.hop)) hops.set(c.hop, []);
    hops.get(c.hop).push(c);
  }
  return hops;
}

function axisRow(axis) {
  const scale = h('div', { class: 'axis', 'aria-hidden': 'true' });
  for (const tick of axis.ticks(2)) {
    const mark = h('span', { class: 'tick' }, tick.label);
    mark.style.left = `${(axis.at(tick.value) * 100).toFixed(2)}%`;
    scale.append(mark);
  }
  return h('div', { class: 'bar-row axis-row', 'aria-hidden': 'true' }, h('span'), scale, h('span'), h('span'));
}

function barRow(c, axis, narrowest) {
  const isNarrowest = c.name === narrowest;
  const bar = h('span', { class: ['bar', isNarrowest ? 'narrowest' : null] });
  bar.style.width = `${Math.max(0.5, axis.at(c.bytes) * 100).toFixed(2)}%`;
  return h('li', { class: ['bar-row', isNarrowest ? 'narrowest' : null], 'data-ceiling': c.name },
    h('span', { class: 'name mono' }, c.name,
      isNarrowest ? h('span', { class: 'flag' }, 'narrowest on the request path') : null),
    h('span', { class: 'track', 'aria-hidden': 'true' }, bar),
    h('span', { class: 'num exact' }, `${exact(c.bytes)} B`),
    h('span', { class: 'hint' }, `${human(c.bytes)} · ${c.source}`));
}

function findings(budget) {
  const errors = budget.errors || [];
  const warnings = budget.warnings || [];
  if (!errors.length && !warnings.length) {
    return h('p', { class: 'good' }, 'Coherent: no errors, no warnings.');
  }
  return h('ul', { class: 'findings' },
    errors.map((f) => h('li', { class: 'bad' }, h('strong', {}, `error ${f.rule}: `), f.message)),
    warnings.map((f) => h('li', { class: 'warn' }, h('strong', {}, `warning ${f.rule}: `), f.message)));
}

function otherCeilings(ceilings) {
  return h('table', {},
    h('thead', {}, h('tr', {}, ['hop', 'ceiling', 'value', 'unit', 'source'].map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', {}, ceilings.map((c) => h('tr', {},
      h('td', {}, c.hop), h('th', { scope: 'row', class: 'mono' }, c.name),
      h('td', { class: 'num' }, typeof c.value === 'number' ? c.value.toLocaleString('en-US') : String(c.value)),
      h('td', {}, c.unit), h('td', {}, c.source)))));
}

function chain(budget) {
  const ceilings = budget.ceilings || [];
  const sized = ceilings.filter((c) => c.bytes !== undefined);
  const axis = logAxis(Math.min(...sized.map((c) => c.bytes)), Math.max(...sized.map((c) => c.bytes)));
  const narrowest = budget.narrowestRequestCeiling;
  const rows = [axisRow(axis)];
  for (const [hop, list] of groupByHop(sized)) {
    rows.push(h('h3', { class: 'hop' }, hop), h('ul', { class: 'hop-bars' }, list.map((c) => barRow(c, axis, narrowest))));
  }
  const narrow = sized.find((c) => c.name === narrowest);
  return [
    narrow ? h('p', { class: 'lead' }, 'Narrowest ceiling on the llm-turn request path: ',
      h('strong', { class: 'mono' }, narrowest), ` = ${exact(narrow.bytes)} bytes (${human(narrow.bytes)}).`) : null,
    h('div', { class: 'bars' }, rows),
    h('h2', {}, 'Coherence'),
    findings(budget),
    h('h2', {}, 'Other ceilings'),
    h('div', { class: 'table-wrap' }, otherCeilings(ceilings.filter((c) => c.bytes === undefined))),
  ];
}

export default {
  id: 'budget',
  title: 'Budget chain',
  nav: true,
  match: (route) => (route === 'budget' ? {} : null),
  mount(root) {
    const body = h('section', { class: 'card', 'data-testid': 'budget-chain', 'aria-labelledby': 'budget-title' },
      h('p', { class: 'hint' }, 'loading…'));
    render(root, h('h1', { id: 'budget-title' }, 'Budget chain'),
      h('p', { class: 'hint' }, 'Every byte ceiling this daemon runs with (hopline limits), on one log scale.'),
      body);
    getJson('/daemon/status').then(
      (status) => render(body, chain(status.budget || {})),
      (exc) => render(body, h('p', { class: 'error' }, exc.message)));
  },
};
