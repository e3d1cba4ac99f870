"""The daemon's sessions (SPEC D-1, D-2, D-6, D-8), one module per concern.

- :mod:`.state`: one session, what it holds and its state machine (``TRANSITIONS``);
- :mod:`.manager`: lookup, create, delete, startup, shutdown, status (the facade the routes call);
- :mod:`.agents`: spawning, the warm pool, the handshake, credentials, binding the agent's session id;
- :mod:`.relay`: the child's traffic onto the bus (demux, held early updates, projection, losses);
- :mod:`.prompts`: prompt serialization and turn ends (and ending the prompts a run left open);
- :mod:`.permissions`: the agent's permission requests and their answers;
- :mod:`.load`: ``session/load`` with bulk replay (D-6);
- :mod:`.ownership`: several daemons: the owned set, fencing, adoption.

Nothing is re-exported here: each caller imports the module it needs (no import circle).
"""
