"""Foundations every wing imports: one-line user errors, atomic files and their proofs, value checks, metrics
that sum exactly under DDP, the Pareto losses, whole-batch indexing and train/eval mode switches."""
