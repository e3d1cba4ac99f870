"""The daemon ("serve", SPEC D): HTTP/SSE routes, one ACP child per session, the event bus and its
SQLite journal. Imports wire, observe, gateway and budget; nothing below imports it."""
