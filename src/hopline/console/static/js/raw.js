// An event a renderer could not show (a malformed update of any kind, from any agent): shown as the
// daemon sent it, escaped (a text node, never markup), with a note; the stream goes on.

import { h } from './dom.js';

const RAW_CHARS_SHOWN = 8000; // of the event's JSON; the transcript holds the rest

export function rawEventItem(event, error) {
  let raw;
  try {
    raw = JSON.stringify(event.data, null, 2);
  } catch (_) {
    raw = String(event.data);
  }
  if (raw === undefined) raw = 'undefined';
  const shown = raw.length > RAW_CHARS_SHOWN ? `${raw.slice(0, RAW_CHARS_SHOWN)}\n…` : raw;
  const name = (error && error.name) || 'Error';
  const message = (error && error.message) || String(error);
  return h('div', { class: ['item', 'bad', 'raw-event'], 'data-testid': 'raw-event' },
    h('p', {}, `This ${event.type} event${event.id != null ? ` (id ${event.id})` : ''} could not be shown `
      + `(${name}: ${message}); here it is as the daemon sent it:`),
    h('pre', { class: 'output' }, shown));
}
