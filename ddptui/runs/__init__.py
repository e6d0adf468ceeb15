"""Runs as data: benchmarks, comparisons, exports, replays, live runs to attach to."""
