"""Refinement of a searched layout: the exact uneven layer split and the per-stage recompute ILP."""
