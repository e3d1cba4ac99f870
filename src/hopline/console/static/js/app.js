// The console's shell: sign-in, the navigation, hash routes and the theme. Each view is a module
// ({id, title, nav, match(route), mount(root, ctx, params) -> unmount}); adding one (as the gate
// runs) is a module and a line in VIEWS.

import { adoptFragmentToken, clearToken, currentToken, getJson, setToken, SIGNED_OUT_EVENT } from './api.js';
import { h, render } from './dom.js';
import budgetView from './views/budget.js';
import framesView from './views/frames.js';
import gatesView from './views/gates.js';
import sessionView from './views/session.js';
import sessionsView from './views/sessions.js';

const VIEWS = [sessionsView, sessionView, budgetView, framesView, gatesView];
const DEFAULT_ROUTE = 'sessions';
const THEME_KEY = 'hopline.theme';
const THEMES = ['auto', 'light', 'dark'];

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const signOutButton = document.getElementById('sign-out');
const themeButton = document.getElementById('theme');
let unmount = null;
let signingIn = false; // the sign-in form is up: a refused token is its own message, not a sign-out

function route() {
  return location.hash.replace(/^#\/?/, '') || DEFAULT_ROUTE;
}

export function navigate(path) {
  location.hash = `#/${path}`;
}

function stopView() {
  if (unmount) unmount();
  unmount = null;
}

function renderNav(active) {
  render(nav, VIEWS.filter((v) => v.nav).map((view) => h('a', {
    href: `#/${view.id}`,
    class: view.id === active ? 'active' : null,
    'aria-current': view.id === active ? 'page' : null,
  }, view.title)));
}

function show() {
  stopView();
  if (!currentToken()) {
    signIn();
    return;
  }
  signingIn = false;
  signOutButton.hidden = false;
  const path = route();
  for (const view of VIEWS) {
    const params = view.match(path);
    if (params) {
      renderNav(view.navAs || view.id);
      document.title = `${view.title} · hopline console`;
      render(main);
      unmount = view.mount(main, { navigate }, params) || null;
      main.focus({ preventScroll: true });
      return;
    }
  }
  navigate(DEFAULT_ROUTE);
}

function signIn(message) {
  stopView();
  signingIn = true;
  signOutButton.hidden = true;
  render(nav);
  document.title = 'Sign in · hopline console';
  const input = h('input', { id: 'token', type: 'password', name: 'token', autocomplete: 'off', required: true,
    spellcheck: 'false', 'aria-describedby': 'token-help' });
  const status = h('p', { class: 'error', role: 'alert' }, message || '');
  const form = h('form', { class: 'card signin', 'data-testid': 'sign-in' },
    h('h1', {}, 'Sign in'),
    h('label', { for: 'token' }, 'Daemon token'),
    input,
    h('p', { id: 'token-help', class: 'hint' },
      'The bearer token of this hopline serve (HOPLINE_SERVER_TOKEN). It stays in this tab ',
      '(sessionStorage) and is sent only as an Authorization header.'),
    h('button', { type: 'submit', class: 'primary' }, 'Sign in'),
    status);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    setToken(input.value.trim());
    try {
      await getJson('/daemon/status');
    } catch (error) {
      clearToken();
      status.textContent = error.status === 401 ? 'The daemon refused this token.' : error.message;
      return;
    }
    if (!location.hash || location.hash === '#') navigate(DEFAULT_ROUTE);
    show();
  });
  render(main, form);
  input.focus();
}

function applyTheme(theme) {
  if (theme === 'auto') delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = theme;
  themeButton.textContent = `Theme: ${theme}`;
}

themeButton.addEventListener('click', () => {
  const next = THEMES[(THEMES.indexOf(localStorage.getItem(THEME_KEY) || 'auto') + 1) % THEMES.length];
  localStorage.setItem(THEME_KEY, next);
  applyTheme(next);
});

signOutButton.addEventListener('click', () => {
  clearToken();
  signIn('Signed out.');
});

window.addEventListener(SIGNED_OUT_EVENT, (event) => {
  if (!signingIn) signIn(`Signed out: ${event.detail}.`);
});
window.addEventListener('hashchange', show);

applyTheme(localStorage.getItem(THEME_KEY) || 'auto');
adoptFragmentToken();
show();
