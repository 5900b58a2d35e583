"""The package version (release/publish.py writes it into every model card and config.json)."""

__version__ = "0.1.0"
