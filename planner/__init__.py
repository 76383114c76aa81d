"""planner: plan, predict and check the parallel layout of large transformer training."""

__version__ = "0.1.0"
SCHEMA_VERSION = "1.10"  # planner/contract.py: major on a breaking change, minor on an added field
