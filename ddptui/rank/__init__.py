"""Code that runs inside every training process: :mod:`.entry` (what a rank runs first),
:mod:`.reporter` (behind ``ddptui.log``), :mod:`.pending` (GPU values read without waiting),
:mod:`.instrument` (zero-code hooks), :mod:`.stacks` (stacks on demand), :mod:`.cpus` (threads
per rank) and :mod:`.net`. Light to import: no Textual, and no torch, numpy or ZeroMQ until
a rank uses them (``tests/test_rank_light.py``); it imports nothing of ``run``, ``runs`` or
the front ends (import-linter)."""
