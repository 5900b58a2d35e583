"""The certified Pareto learners (Algs 2-4): Newton steps from A(D) released with an (epsilon, delta)
certificate. The Method (learner.py) and its run (common.py), the LightningModule of the certified step
(module.py), its settings (schema.py), theta by rule (theta.py), and the mathematics of the step (maths/)."""
