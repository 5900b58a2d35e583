"""Reporting, in one package without import cycles: results.py (results.json, the terminal tables) <-
wandb_charts.py (a run's or a sweep's tables and figures to wandb) <- tables.py (Markdown tables from results
files) <- plots.py (PNG figures). `python -m ttp_lightning.tables` and `python -m ttp_lightning.plots` stay
the command lines."""
