"""The decisions a team makes with a plan: time, cost and energy to train (train.py), which cluster
(compare.py), how many GPUs (scaling.py), and whether the pick survives a wrong assumption (sensitivity.py).

Each calls the planner's public search (planner.search.plan) and the cost models; none re-implements them.
"""
