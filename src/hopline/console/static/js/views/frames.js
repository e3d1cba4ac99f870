// Pipe frames: the hopline.daemon.pipe.message_bytes histogram per direction (GET /daemon/frames),
// with the pipe max frame, the sidecar threshold and the large-frame threshold drawn as lines;
// beside it the recent large-frame records and the suppressed count. Refreshed live.

import { getJson } from '../api.js';
import { logAxis } from '../chart.js';
import { h, render, svg } from '../dom.js';
import { bytes, clock, count, exact, human } from '../format.js';
import { refreshEvery } from '../refresh.js';

const WIDTH = 640;
const HEIGHT = 210;
const PAD = { left: 22, right: 26, top: 18, bottom: 34 };
const LINE_LABELS = {
  pipe_max_frame_bytes: 'pipe max frame',
  sidecar_threshold_bytes: 'sidecar threshold',
  large_frame_threshold_bytes: 'large-frame threshold',
};

function buckets(boundaries, counts, axis) {
  // bucket i is (boundaries[i-1], boundaries[i]]; the first starts at the axis, the last is overflow
  return counts.map((count, i) => ({
    count,
    lo: i === 0 ? axis.lo : boundaries[i - 1],
    hi: i < boundaries.length ? boundaries[i] : axis.hi,
    label: i === 0 ? `≤ ${human(boundaries[0])}` : i < boundaries.length
      ? `${human(boundaries[i - 1])} – ${human(boundaries[i])}` : `> ${human(boundaries[i - 1])}`,
  }));
}

function histogram(direction, data, boundaries, lines, axis) {
  const plotW = WIDTH - PAD.left - PAD.right;
  const plotH = HEIGHT - PAD.top - PAD.bottom;
  const x = (v) => PAD.left + axis.at(v) * plotW;
  const list = buckets(boundaries, data.counts, axis);
  const peak = Math.max(1, ...list.map((b) => b.count));
  const y = (count) => (count ? Math.max(2, (Math.log10(1 + count) / Math.log10(1 + peak)) * plotH) : 0);
  const chart = svg('svg', { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, class: 'histogram', role: 'img',
    'aria-label': `${direction}: ${exact(data.count)} frames in ${list.filter((b) => b.count).length} non-empty buckets` });
  chart.append(svg('line', { class: 'baseline', x1: PAD.left, x2: WIDTH - PAD.right, y1: PAD.top + plotH, y2: PAD.top + plotH }));
  for (const tick of axis.ticks(2)) {
    chart.append(svg('line', { class: 'grid', x1: x(tick.value), x2: x(tick.value), y1: PAD.top, y2: PAD.top + plotH }));
    chart.append(svg('text', { class: 'tick', x: x(tick.value), y: HEIGHT - PAD.bottom + 14, 'text-anchor': 'middle' }, tick.label));
  }
  for (const b of list) {
    if (!b.count) continue;
    const height = y(b.count);
    const left = x(b.lo) + 1;
    const width = Math.max(2, x(b.hi) - x(b.lo) - 2);
    chart.append(svg('rect', { class: 'bucket', x: left, y: PAD.top + plotH - height, width, height, 'data-count': b.count },
      svg('title', {}, `${b.label}: ${exact(b.count)} frames`)));
    chart.append(svg('text', { class: 'count', x: left + width / 2, y: PAD.top + plotH - height - 4, 'text-anchor': 'middle' },
      exact(b.count)));
  }
  for (const line of lines) {
    chart.append(svg('line', { class: `limit ${line.key}`, x1: x(line.bytes), x2: x(line.bytes), y1: PAD.top - 8, y2: PAD.top + plotH },
      svg('title', {}, `${LINE_LABELS[line.key] || line.description}: ${exact(line.bytes)} bytes (${line.name})`)));
  }
  chart.append(svg('text', { class: 'axis-label', x: WIDTH / 2, y: HEIGHT - 4, 'text-anchor': 'middle' },
    'frame size (log scale; bar heights log scale)'));
  return h('figure', { class: 'direction', 'data-direction': direction },
    h('figcaption', {}, h('strong', {}, direction), ' ',
      h('span', { class: 'hint' }, `${count(data.count, 'frame')} · ${bytes(data.sumBytes)} in all`)),
    chart,
    h('details', {}, h('summary', {}, 'Bucket counts'),
      h('table', { class: 'compact' }, h('tbody', {}, list.map((b) => h('tr', {},
        h('th', { scope: 'row' }, b.label), h('td', { class: 'num' }, exact(b.count))))))));
}

function legend(lines) {
  return h('ul', { class: 'legend' }, lines.map((line) => h('li', {},
    h('span', { class: `swatch ${line.key}`, 'aria-hidden': 'true' }),
    `${LINE_LABELS[line.key] || line.description}: `, h('span', { class: 'mono' }, `${exact(line.bytes)} B`),
    ` (${human(line.bytes)}, ${line.name})`)));
}

function largestField(r) {
  const sizes = [r.maxContentTextBytes, r.maxRawOutputTextBytes, r.maxRawOutputApproxBytes].filter((v) => v !== undefined);
  return sizes.length ? `largest text ${exact(Math.max(...sizes))} B` : null;
}

function record(r) {
  const kind = r.sessionUpdate || r.method || r.messageKind;
  const details = [r.sourceClass, kind, r.toolName ? `tool ${r.toolName}` : null, largestField(r),
    r.updateCount !== undefined ? count(r.updateCount, 'update') : null,
    r.suppressedCount ? `${exact(r.suppressedCount)} suppressed before it` : null].filter(Boolean);
  return h('li', { class: 'record', 'data-direction': r.direction },
    h('div', {}, h('span', { class: 'hint' }, clock(r.atMs)), ' ', h('strong', {}, r.direction), ' ',
      h('span', { class: 'mono' }, `${exact(r.bytes)} B`), ' ', h('span', { class: 'hint' }, `(${human(r.bytes)})`)),
    h('div', { class: 'record-details' }, details.join(' · ')));
}

function records(large) {
  const recent = large.recent || [];
  return [
    h('p', {}, `${exact(large.logged)} logged · `, h('strong', { class: large.suppressed ? 'warn' : null },
      `${exact(large.suppressed)} suppressed`), ` · threshold ${bytes(large.thresholdBytes)}`),
    recent.length ? h('ol', { class: 'records', 'aria-label': 'Recent large frames, newest first' }, recent.map(record))
      : h('p', { class: 'hint' }, `No frame of ${human(large.thresholdBytes)} or more has crossed the pipe.`),
  ];
}

export default {
  id: 'frames',
  title: 'Pipe frames',
  nav: true,
  match: (route) => (route === 'frames' ? {} : null),
  mount(root) {
    const charts = h('section', { class: 'card', 'data-testid': 'frame-histogram', 'aria-labelledby': 'hist-title' },
      h('h2', { id: 'hist-title' }, 'Frame sizes'), h('p', { class: 'hint' }, 'loading…'));
    const large = h('section', { class: 'card', 'data-testid': 'large-frames', 'aria-labelledby': 'large-title' },
      h('h2', { id: 'large-title' }, 'Large frames'));
    const note = h('p', { class: 'hint', role: 'status' });
    render(root, h('h1', {}, 'Pipe frames'),
      h('p', { class: 'hint' }, 'Every ACP pipe message, daemon side, by size (hopline.daemon.pipe.message_bytes).'),
      h('div', { class: 'two-columns' }, charts, large), note);
    return refreshEvery(async () => {
      const frames = await getJson('/daemon/frames');
      const { boundaries, directions } = frames.histogram;
      const values = [...boundaries, ...frames.lines.map((l) => l.bytes)];
      const axis = logAxis(Math.min(...values) / 4, Math.max(...values) * 4);
      const open = new Set([...charts.querySelectorAll('figure details[open]')].map((d) => d.closest('figure').dataset.direction));
      render(charts, h('h2', { id: 'hist-title' }, 'Frame sizes'), legend(frames.lines),
        Object.entries(directions).map(([direction, data]) => histogram(direction, data, boundaries, frames.lines, axis)));
      for (const figure of charts.querySelectorAll('figure')) {
        if (open.has(figure.dataset.direction)) figure.querySelector('details').open = true;
      }
      render(large, h('h2', { id: 'large-title' }, 'Large frames'), records(frames.largeFrames));
    }, note);
  },
};
