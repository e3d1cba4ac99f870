"""The gate workflow (SPEC K): four gate agents review a pull request's ``base..head`` while the
dev agent waits in ``awaiting_gate`` (K-2).

``states`` (the pending items, ``DEV_PENDING_TYPES``, the dev state machine) and ``verdict`` (its
schema) and ``sarif`` (the SARIF 2.1.0 writer) are pure; ``git`` runs git for the commits, the merge
base and the head checkout; ``run`` orchestrates one run through a small driver protocol the daemon
implements (``hopline.daemon.gates``). This package never imports the daemon or the CLI.
"""
