"""One run: its options and their checks, the launchers, the session, the run directory,
``RunState`` and the diagnosis, and the multi-node pieces node 0 needs (``cluster``)."""
