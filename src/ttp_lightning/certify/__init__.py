"""Certified Pareto learners (Sec. 3.2): curvature of the Pareto objective, inverse-Hessian estimates,
and the Gaussian mechanism that turns a sensitivity bound into noise."""
