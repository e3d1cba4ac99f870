"""The offline scripted model: hopline's default provider, deterministic and seeded, with everything
only it needs (``HOPLINE_PROVIDER=scripted``, the gateway's default; ``hopline agent`` without a
gateway runs it in-process).

* :mod:`.model`: the model (``ScriptedModel``), its hints and their bounds, and ``InProcessModel``;
* :mod:`.review` and ``review_plan``, ``review_checks``, ``review_analyze``, ``review_fix``: how it
  plays the four gate agents and the fixing dev agent on a real diff;
* :mod:`.sample_workspace` and :mod:`.sample_pull_request`: the generated project and pull request
  of ``hopline demo``, ``hopline simulate`` and the tests.
"""
