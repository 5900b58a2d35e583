"""The mathematics of the certified step (Sec. 3.2), pure (no Lightning, no config): curvature of the Pareto
objective, Hessian-vector products, inverse-Hessian estimates, the Newton path and the a-posteriori residual
bound. The privacy side (sensitivities, the Gaussian mechanism, the noise) is in ttp_lightning.dp."""
