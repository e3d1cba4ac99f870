// Numbers as the CLI shows them: exact bytes with separators, and 1024-based units
// (the same rule as hopline.budget.format_size: exact when a whole number of units).

const UNITS = [['GiB', 1024 ** 3], ['MiB', 1024 ** 2], ['KiB', 1024]];

export function exact(n) {
  return Number(n).toLocaleString('en-US');
}

export function human(n) {
  const size = Number(n);
  for (const [unit, factor] of UNITS) {
    if (size >= factor) {
      return size % factor === 0 ? `${size / factor} ${unit}` : `${(size / factor).toFixed(2)} ${unit}`;
    }
  }
  return `${size} B`;
}

export function bytes(n) {
  return Number(n) >= 1024 ? `${exact(n)} B (${human(n)})` : `${exact(n)} B`;
}

export function tokens(n) {
  const value = Number(n) || 0;
  return value >= 1000 ? `${(value / 1000).toFixed(1)}k` : String(value);
}

export function shortId(id) {
  return String(id || '').slice(0, 8);
}

export function clock(ms) {
  return new Date(ms).toLocaleTimeString('en-GB', { hour12: false });
}

/** "1 update", "3 updates" (the count with separators). */
export function count(n, word) {
  return `${exact(n)} ${word}${Number(n) === 1 ? '' : 's'}`;
}

const ACTIVITIES = { running: 'running', awaiting_permission: 'awaiting permission', idle: 'idle' };

/** What a session's badge says: what it is doing while it has an agent (running, awaiting
 *  permission, idle), else its state (starting, loading, detached); and the badge's class. */
export function doing(row) {
  if (row.state === 'ready' && ACTIVITIES[row.activity]) {
    return { text: ACTIVITIES[row.activity], cls: `activity-${row.activity}` };
  }
  return { text: row.state, cls: `state-${row.state}` };
}

/** A value of the one limit shape ({limit, observed, unit}) in its unit: bytes as `bytes` shows them. */
export function amount(n, unit) {
  return unit === undefined || unit === 'bytes' ? bytes(n) : `${exact(n)} ${unit}`;
}
