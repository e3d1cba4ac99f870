"""The offline scripted model: hopline's default provider, deterministic and seeded, with everything
only it needs (``HOPLINE_PROVIDER=scripted``, the gateway's default; ``hopline agent`` without a
gateway runs it in-process).

* :mod:`.model`: the model (``ScriptedModel``) and ``InProcessModel``; :mod:`.hints`: its hints
  and their bounds, checked wherever a client hands them in; :mod:`.naive`: the sizing of an engine
  without the budget, which ``--naive`` replays;
* :mod:`.review` and ``review_plan``, ``review_checks``, ``review_analyze``, ``review_fix``: how it
  plays the four gate agents and the fixing dev agent on a real diff;
* :mod:`.sample_workspace` and :mod:`.sample_pull_request`: the generated project and pull request
  of ``hopline demo``, ``hopline simulate`` and the tests.
"""
