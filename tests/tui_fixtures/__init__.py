"""Recorded runs and fakes for the dashboard tests (snapshot, pilot) and the benchmark."""
