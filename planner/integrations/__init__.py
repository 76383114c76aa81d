"""Integrations with training frameworks: exports of a plan and readers (check) of their configs."""
