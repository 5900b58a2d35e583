"""LightningModules (the Lightning-Hydra layout): ERM pretraining and retraining (erm.py), Pareto finetuning,
Alg 1 (pareto.py), the certified Newton steps, Algs 2-4 (certified.py) and the final evaluation
(evaluation.py); the networks they train are in components/."""
