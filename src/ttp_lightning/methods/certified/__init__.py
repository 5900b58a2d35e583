"""The certified Pareto learners (Algs 2-4): Newton steps with released (epsilon, delta) certificates."""
