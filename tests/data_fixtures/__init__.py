"""Recorded runs for compare, export and bench tests (see record.py for how they were made)."""
