"""Explaining a plan: the decision table, the terminal rendering and the pipeline picture."""
