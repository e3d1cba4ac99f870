// The daemon API as the console uses it: the bearer token from sessionStorage on every call, and
// errors turned into one readable line (hop, limit, observed size when the daemon names them).
// The token is only ever sent in the Authorization header, never in a URL.

const TOKEN_KEY = 'hopline.token';
export const SIGNED_OUT_EVENT = 'hopline:signed-out';

export function currentToken() {
  return sessionStorage.getItem(TOKEN_KEY) || '';
}

export function setToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
}

export function clearToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** Moves a `#token=…` fragment to sessionStorage and removes it from the address bar. */
export function adoptFragmentToken() {
  const match = /^#token=([^&]*)/.exec(location.hash);
  if (!match) return false;
  const token = decodeURIComponent(match[1]);
  history.replaceState(null, '', location.pathname + location.search + '#/sessions');
  if (token) setToken(token);
  return Boolean(token);
}

export class ApiError extends Error {
  constructor(status, body, fallback) {
    super(describeError(body, fallback || `HTTP ${status}`));
    this.status = status;
    this.body = body;
  }
}

/** One line for an error body of any of the daemon's shapes. */
function describeError(body, fallback) {
  if (!body || typeof body !== 'object') return fallback;
  const error = body.error;
  if (error && typeof error === 'object') {
    const parts = [error.message || error.type || fallback];
    if (error.hop) parts.push(`hop ${error.hop}`);
    // A limit passed, a size or a count: one shape (limit, observed, unit; hopline.errors).
    const unit = error.unit === 'bytes' ? 'B' : (error.unit || '');
    if (error.limit !== undefined) parts.push(`limit ${error.limit} ${unit}`.trim());
    if (error.observed !== undefined) parts.push(`observed ${error.observed} ${unit}`.trim());
    return parts.join(' · ');
  }
  if (typeof error === 'string') return body.hop ? `${error} · hop ${body.hop}` : error;
  if (Array.isArray(body.detail)) {
    return body.detail.map((d) => `${(d.loc || []).slice(1).join('.') || 'body'}: ${d.msg}`).join('; ');
  }
  if (typeof body.detail === 'string') return body.detail;
  return fallback;
}

/** fetch() with the bearer token; a 401 signs the page out. */
export async function authFetch(path, options = {}) {
  const headers = new Headers(options.headers || {});
  headers.set('Authorization', `Bearer ${currentToken()}`);
  const response = await fetch(path, { ...options, headers, cache: 'no-store', credentials: 'omit' });
  if (response.status === 401) {
    clearToken();
    window.dispatchEvent(new CustomEvent(SIGNED_OUT_EVENT, { detail: 'the daemon refused the token' }));
  }
  return response;
}

async function jsonOf(response) {
  const text = await response.text();
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

/** The ApiError of a failed response, with its JSON body when it has one. */
export async function errorOf(response) {
  return new ApiError(response.status, await jsonOf(response));
}

export async function request(method, path, body) {
  const options = { method };
  if (body !== undefined) {
    options.body = JSON.stringify(body);
    options.headers = { 'Content-Type': 'application/json' };
  }
  const response = await authFetch(path, options);
  const data = await jsonOf(response);
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

export const getJson = (path) => request('GET', path);
export const postJson = (path, body) => request('POST', path, body ?? {});

export function sessionPath(sessionId, ...rest) {
  return ['/session', encodeURIComponent(sessionId), ...rest.map(encodeURIComponent)].join('/');
}

/** A ceiling's value from /daemon/status's budget, by its public name. */
export function ceilingOf(budget, name) {
  const row = (budget?.ceilings || []).find((c) => c.name === name);
  if (!row) return undefined;
  return row.bytes !== undefined ? row.bytes : row.value;
}

/** The client reader's ceilings (hop client.sse), as the daemon's budget declares them: an
 * EventStream's options. */
export function clientSseOptions(budget) {
  return {
    maxEventBytes: ceilingOf(budget, 'HOPLINE_CLIENT_SSE_MAX_EVENT_BYTES'),
    reconnectAttempts: ceilingOf(budget, 'HOPLINE_CLIENT_SSE_RECONNECT_ATTEMPTS'),
    backoffSeconds: ceilingOf(budget, 'HOPLINE_CLIENT_SSE_RECONNECT_BACKOFF'),
  };
}
