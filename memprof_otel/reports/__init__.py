"""Presentation over recorded data: the operations report, plots, summaries, timeline files."""
