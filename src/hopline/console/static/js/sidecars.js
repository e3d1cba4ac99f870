// Sidecars: fields of an update that the daemon moved off the wire (SPEC S-1). `sidecarEntries`
// is the one place the console reads `_meta["hopline.sidecar"]`; `fetchVerified` downloads one
// with the bearer header and checks its size and sha256 in the browser (Web Crypto).

import { authFetch, errorOf, sessionPath } from './api.js';

const META_KEY = 'hopline.sidecar';
// The marker the daemon puts between the head and the tail of a preview.
const MARKER = /\n… \[hopline: [^\]\n]*\] …\n/;

function keysOfField(field) {
  // "content[0].text" -> ["content", 0, "text"]
  const keys = [];
  for (const part of String(field || '').split('.')) {
    const match = /^([^[\]]*)((?:\[\d+\])*)$/.exec(part);
    if (!match) return null;
    if (match[1]) keys.push(match[1]);
    for (const index of match[2].matchAll(/\[(\d+)\]/g)) keys.push(Number(index[1]));
  }
  return keys;
}

function keysOfPath(path) {
  if (Array.isArray(path)) return path;
  if (typeof path === 'string' && path.startsWith('/')) {
    // a JSON pointer
    return path.slice(1).split('/').map((k) => (/^\d+$/.test(k) ? Number(k) : k.replace(/~1/g, '/').replace(/~0/g, '~')));
  }
  if (typeof path === 'string') return keysOfField(path);
  return null;
}

function walk(value, keys) {
  let node = value;
  for (const key of keys || []) {
    if (node === null || typeof node !== 'object') return undefined;
    node = node[key];
  }
  return node;
}

/** The moved value's stand-in on the wire: a preview string, or a JSON stub with `preview`. */
function wireValue(update, entry) {
  const keys = keysOfPath(entry.path ?? entry.field);
  let value = walk(update, keys);
  if (value === undefined && keys && keys.length === 3 && keys[0] === 'content') {
    // a tool-call content entry wraps its block: `content[i].text` is content[i].content.text
    value = walk(update, [keys[0], keys[1], 'content', keys[2]]);
  }
  return value;
}

function splitPreview(text) {
  if (typeof text !== 'string') return { head: '', tail: '' };
  const match = MARKER.exec(text);
  if (!match) return { head: text, tail: '' };
  return { head: text.slice(0, match.index), tail: text.slice(match.index + match[0].length) };
}

/**
 * The sidecar entries of an ACP update, normalized:
 * {field, path, id, bytes, sha256, mediaType, truncated, reason, head, tail, resolvable}.
 */
export function sidecarEntries(update) {
  const meta = update && typeof update === 'object' ? update._meta : null;
  let entries = meta && typeof meta === 'object' ? meta[META_KEY] : null;
  if (entries && !Array.isArray(entries) && typeof entries === 'object') entries = [entries];
  if (!Array.isArray(entries)) return [];
  return entries.filter((e) => e && typeof e === 'object').map((entry) => {
    const value = wireValue(update, entry);
    const preview = typeof value === 'string' ? value : value && typeof value === 'object' ? value.preview : '';
    const { head, tail } = splitPreview(preview);
    const id = typeof entry.id === 'string' ? entry.id : null;
    const sha256 = typeof entry.sha256 === 'string' ? entry.sha256.toLowerCase() : null;
    const truncated = Boolean(entry.truncated);
    return {
      field: String(entry.field ?? (Array.isArray(entry.path) ? entry.path.join('.') : entry.path ?? '')),
      path: entry.path,
      id,
      bytes: Number(entry.bytes) || 0,
      sha256,
      mediaType: typeof entry.mediaType === 'string' ? entry.mediaType : 'application/octet-stream',
      truncated,
      reason: typeof entry.reason === 'string' ? entry.reason : null,
      head,
      tail,
      resolvable: Boolean(id && sha256 && !truncated),
    };
  });
}

export class SidecarMismatch extends Error {}

function hex(buffer) {
  return Array.from(new Uint8Array(buffer), (b) => b.toString(16).padStart(2, '0')).join('');
}

/** Reads the sidecar, never more than its entry's size, and checks size and sha256. */
export async function fetchVerified(sessionId, entry) {
  const response = await authFetch(sessionPath(sessionId, 'sidecars', entry.id));
  if (!response.ok) throw await errorOf(response);
  const declared = Number(response.headers.get('content-length'));
  if (Number.isFinite(declared) && declared > entry.bytes) {
    await response.body.cancel();
    throw new SidecarMismatch(`the daemon sent ${declared} bytes; the entry says ${entry.bytes}`);
  }
  const data = new Uint8Array(entry.bytes);
  let at = 0;
  const reader = response.body.getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    if (at + value.length > entry.bytes) {
      await reader.cancel();
      throw new SidecarMismatch(`more than the ${entry.bytes} bytes the entry says`);
    }
    data.set(value, at);
    at += value.length;
  }
  if (at !== entry.bytes) throw new SidecarMismatch(`got ${at} bytes; the entry says ${entry.bytes}`);
  const digest = hex(await crypto.subtle.digest('SHA-256', data));
  if (digest !== entry.sha256) throw new SidecarMismatch(`sha256 ${digest} does not match the entry's ${entry.sha256}`);
  return { data, sha256: digest };
}

export function fileName(entry) {
  const extension = entry.mediaType.startsWith('application/json') ? 'json' : 'txt';
  const field = entry.field.replace(/[^A-Za-z0-9_-]+/g, '_').replace(/^_+|_+$/g, '') || 'field';
  return `sidecar-${field}-${entry.id.slice(0, 12)}.${extension}`;
}

/** Hands verified bytes to the browser's download (a blob: URL, revoked once used). */
export function saveBytes(data, mediaType, name) {
  const url = URL.createObjectURL(new Blob([data], { type: mediaType }));
  const link = document.createElement('a');
  link.href = url;
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}
