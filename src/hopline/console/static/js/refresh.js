// Live views poll the daemon: each load starts when the previous one has finished, so a slow
// daemon is never asked twice at once.

const REFRESH_MS = 2000;

/** Runs `load` now and REFRESH_MS after each run; `note` (optional) says when, or why not. */
export function refreshEvery(load, note) {
  let timer = null;
  let stopped = false;
  async function run() {
    try {
      await load();
      if (note) note.textContent = `Updated ${new Date().toLocaleTimeString('en-GB')}; refreshed every ${REFRESH_MS / 1000} s.`;
    } catch (exc) {
      if (note) note.textContent = `Could not refresh: ${exc.message}`;
    }
    if (!stopped) timer = setTimeout(run, REFRESH_MS);
  }
  run();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
