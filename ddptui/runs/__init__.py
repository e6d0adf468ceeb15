"""Runs as data: :mod:`.bench` (a matrix planned and measured) with :mod:`.bench_report` (its
table, CSV and Markdown) and :mod:`.benchmath`, :mod:`.compare`, :mod:`.export`,
:mod:`.replay`, :mod:`.live` (which runs are live) and :mod:`.attach` (checking a run to
attach to). Each command takes its dashboard from the front end; nothing here imports Textual.
"""
