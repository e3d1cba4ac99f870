// The session event stream: fetch() with a reader (so the token goes in a header, never a URL),
// a bounded SSE parser, and resume with Last-Event-ID after a dropped connection.
//
// The parser follows hopline.wire.sse: an event's size is the bytes of the field values it
// delivers (data lines joined with "\n", the event type, the id); an event over the client reader
// ceiling (HOPLINE_CLIENT_SSE_MAX_EVENT_BYTES) is refused before its bytes are buffered.

import { ApiError, authFetch, errorOf } from './api.js';

const HOP_CLIENT_SSE = 'client.sse';
const KEPT_FIELDS = new Set(['data', 'event', 'id']);
const NEWLINE = new Uint8Array([0x0a]);
const BACKOFF_CAP = 32; // the backoff doubles up to 32 x its first value, as the Python client does

export class SseEventTooLarge extends Error {
  constructor(limit, seen) {
    super(`hop ${HOP_CLIENT_SSE}: event exceeds ${limit} bytes (read ${seen} so far)`);
    this.hop = HOP_CLIENT_SSE;
    this.limit = limit;
    this.seen = seen;
  }
}

function concat(parts, total) {
  const out = new Uint8Array(total);
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.length;
  }
  return out;
}

export class SseParser {
  constructor(maxEventBytes) {
    this.max = maxEventBytes;
    this.decoder = new TextDecoder();
    this.afterCr = false;
    this.resetLine();
    this.resetEvent();
  }

  resetLine() {
    this.line = []; // pending pieces of an incomplete line
    this.lineBytes = 0;
    this.field = null; // its field name, once its colon was seen
    this.valueStart = -1; // where its value starts (after the colon)
    this.firstValueByte = null; // an optional space there is syntax, not value
    this.skipping = false; // a comment (heartbeat) or a dropped field: never buffered
  }

  resetEvent() {
    this.data = [];
    this.event = null;
    this.id = null;
    this.size = 0;
  }

  /** Feeds bytes; returns the events they complete, as {id, event, data, size}. */
  feed(chunk) {
    const out = [];
    let pos = 0;
    if (this.afterCr && chunk.length && chunk[0] === 0x0a) pos = 1;
    this.afterCr = false;
    let nextLf = -2;
    let nextCr = -2; // cached: each is searched again only once passed, so a chunk is scanned once
    while (pos < chunk.length) {
      if (nextLf !== -1 && nextLf < pos) nextLf = chunk.indexOf(0x0a, pos);
      if (nextCr !== -1 && nextCr < pos) nextCr = chunk.indexOf(0x0d, pos);
      let end = chunk.length;
      if (nextLf >= 0) end = nextLf;
      if (nextCr >= 0 && nextCr < end) end = nextCr;
      this.extend(chunk.subarray(pos, end));
      if (end === chunk.length) break;
      this.finishLine(out);
      if (chunk[end] === 0x0d) {
        if (end + 1 === chunk.length) this.afterCr = true;
        else if (chunk[end + 1] === 0x0a) end++;
      }
      pos = end + 1;
    }
    return out;
  }

  /** What the pending line adds to the event's size once complete (before its colon: all of it). */
  pendingValueBytes(total) {
    if (this.field === null) return total;
    let value = total - this.valueStart;
    if (value > 0 && this.firstValueByte === 0x20) value -= 1;
    if (this.field === 'data') return value + (this.data.length ? 1 : 0);
    if (this.field === 'event') return value - (this.event ? this.event.length : 0);
    return value - (this.id ? this.id.length : 0);
  }

  extend(piece) {
    if (!piece.length || this.skipping) return;
    if (this.lineBytes === 0 && piece[0] === 0x3a) {
      this.skipping = true;
      return;
    }
    if (this.field === null) {
      const colon = piece.indexOf(0x3a);
      if (colon >= 0) {
        const name = this.decoder.decode(concat([...this.line, piece.subarray(0, colon)], this.lineBytes + colon));
        if (!KEPT_FIELDS.has(name)) {
          this.resetLine();
          this.skipping = true;
          return;
        }
        this.field = name;
        this.valueStart = this.lineBytes + colon + 1;
      }
    }
    if (this.field !== null && this.firstValueByte === null) {
      const offset = this.valueStart - this.lineBytes;
      if (offset >= 0 && offset < piece.length) this.firstValueByte = piece[offset];
    }
    const projected = this.size + this.pendingValueBytes(this.lineBytes + piece.length);
    if (projected > this.max) {
      this.resetLine();
      this.resetEvent();
      throw new SseEventTooLarge(this.max, projected);
    }
    this.line.push(piece);
    this.lineBytes += piece.length;
  }

  finishLine(out) {
    if (this.skipping) {
      this.resetLine();
      return;
    }
    const bytes = concat(this.line, this.lineBytes);
    const { field, valueStart } = this;
    this.resetLine();
    if (!bytes.length) {
      this.dispatch(out);
      return;
    }
    let name = field;
    let value = new Uint8Array(0);
    if (name === null) {
      name = this.decoder.decode(bytes); // no colon: a field name with an empty value
      if (!KEPT_FIELDS.has(name)) return;
    } else {
      value = bytes.subarray(valueStart);
      if (value[0] === 0x20) value = value.subarray(1);
    }
    let added = value.length;
    if (name === 'data') added += this.data.length ? 1 : 0;
    else if (name === 'event') added -= this.event ? this.event.length : 0;
    else added -= this.id ? this.id.length : 0;
    if (this.size + added > this.max) {
      const seen = this.size + added;
      this.resetEvent();
      throw new SseEventTooLarge(this.max, seen);
    }
    this.size += added;
    if (name === 'data') this.data.push(value);
    else if (name === 'event') this.event = value;
    else if (!value.includes(0)) this.id = value;
  }

  dispatch(out) {
    if (!this.data.length && this.event === null && this.id === null) return;
    const parts = [];
    let total = 0;
    this.data.forEach((part, i) => {
      if (i) {
        parts.push(NEWLINE);
        total += 1;
      }
      parts.push(part);
      total += part.length;
    });
    out.push({
      id: this.id === null ? null : this.decoder.decode(this.id),
      event: this.event === null ? 'message' : this.decoder.decode(this.event),
      data: this.decoder.decode(concat(parts, total)),
      size: this.size,
    });
    this.resetEvent();
  }
}

/**
 * A session's events, live. `onEvent({id, type, data, size})` gets each event once (ids only go
 * up: a replayed event already seen is skipped); `onState(state)` hears about the connection:
 * {kind: 'connecting' | 'live' | 'reconnecting' | 'resumed' | 'failed' | 'stopped', ...}.
 */
export class EventStream {
  constructor(path, { maxEventBytes, reconnectAttempts, backoffSeconds, onEvent, onState }) {
    this.path = path;
    this.maxEventBytes = maxEventBytes;
    this.reconnectAttempts = reconnectAttempts;
    this.backoffSeconds = backoffSeconds;
    this.onEvent = onEvent;
    this.onState = onState;
    this.lastEventId = 0;
    this.controller = null;
    this.stopped = false;
    this.drops = 0;
  }

  start() {
    this.run();
  }

  stop() {
    this.stopped = true;
    if (this.controller) this.controller.abort();
    this.onState({ kind: 'stopped', lastEventId: this.lastEventId });
  }

  /** Starts over from the first event (after state_resync_required). */
  restartFromZero() {
    this.lastEventId = 0;
    if (this.controller) this.controller.abort();
  }

  async run() {
    let failures = 0;
    while (!this.stopped) {
      const resuming = this.lastEventId > 0 && this.drops > 0;
      this.onState({ kind: 'connecting', lastEventId: this.lastEventId, resuming });
      let error = null;
      try {
        await this.connect(resuming, () => {
          failures = 0;
        });
      } catch (exc) {
        error = exc;
      }
      if (this.stopped) return;
      if (error instanceof SseEventTooLarge || (error instanceof ApiError && error.status < 500)) {
        this.onState({ kind: 'failed', error: error.message, lastEventId: this.lastEventId });
        return;
      }
      this.drops += 1;
      failures += 1;
      if (failures > this.reconnectAttempts) {
        this.onState({ kind: 'failed', lastEventId: this.lastEventId,
          error: `the event stream was lost after ${failures - 1} reconnect attempts` });
        return;
      }
      const delay = this.backoffSeconds * Math.min(2 ** (failures - 1), BACKOFF_CAP);
      this.onState({ kind: 'reconnecting', attempt: failures, of: this.reconnectAttempts,
        delaySeconds: delay, lastEventId: this.lastEventId, error: error ? String(error.message || error) : null });
      await new Promise((resolve) => setTimeout(resolve, delay * 1000));
    }
  }

  async connect(resuming, onConnected) {
    this.controller = new AbortController();
    const headers = { Accept: 'text/event-stream' };
    const after = this.lastEventId;
    if (after > 0) headers['Last-Event-ID'] = String(after);
    const response = await authFetch(this.path, { headers, signal: this.controller.signal });
    if (!response.ok) throw await errorOf(response);
    onConnected();
    const parser = new SseParser(this.maxEventBytes);
    const reader = response.body.getReader();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return; // the daemon ended the stream (eviction, shutdown): resume
        for (const message of parser.feed(value)) this.deliver(message, resuming, after);
      }
    } finally {
      reader.cancel().catch(() => {});
    }
  }

  deliver(message, resuming, after) {
    let data = null;
    try {
      data = message.data ? JSON.parse(message.data) : {};
    } catch {
      data = { unparsed: message.data.length };
    }
    const id = message.id === null ? null : Number(message.id);
    if (id !== null) {
      if (id <= this.lastEventId) return; // already shown
      this.lastEventId = id;
    }
    if (message.event === 'replay_complete') {
      this.onState({ kind: resuming ? 'resumed' : 'live', after, replayed: data.replayed,
        lastEventId: this.lastEventId });
    }
    this.onEvent({ id, type: message.event, data, size: message.size });
  }
}
