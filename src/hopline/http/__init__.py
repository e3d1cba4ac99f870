"""The HTTP edge both apps share (the daemon's API and the gateway's llm-turn): bearer auth
(:mod:`.auth`), the one body-limit middleware (:mod:`.body_limit`), hopline's JSON error responses
(:mod:`.errors`, :mod:`.handlers`), the last resort and its incident ids (:mod:`.incidents`), and the
uvicorn server with the request-head limits uvicorn lacks (:mod:`.server`)."""
