"""Fit machinery: Trainers, resumable checkpoints, SIGTERM handling, the console's progress, A(D)'s cached
pretraining, and callbacks (the generic ones here, Alg 1's in alg1/callbacks.py)."""
