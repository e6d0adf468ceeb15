"""One run: its options and their checks, the launchers, the session, the run directory,
``RunState`` and the diagnosis.

Options: :mod:`.options` (values, parsers, :class:`~.options.RunConfig`), :mod:`.machine`,
:mod:`.config` (a whole config built in one pass over :mod:`.check_target`,
:mod:`.check_devices` and :mod:`.check_files`), :mod:`.registry` (the trainers). Running:
:mod:`.launcher` and its child process :mod:`.drivers`, :mod:`.session`, :mod:`.collector`,
:mod:`.signals`, :mod:`.probe`, and :mod:`.cluster` (node 0's side of a multi-node run).
What is known: :mod:`.state` (``RunState``), :mod:`.diagnosis`, :mod:`.rundir` (reading and
writing the run directory; its file names are :mod:`ddptui.runfiles`).
"""
