"""Pure cost models of transformer training (standard library only; SI units in every name).

memory: model states under ZeRO, activations; compute: parameters, FLOPs, MFU; communication:
alpha-beta collectives on a topology; pipeline: bubbles and timelines; step: the whole iteration.
"""
