"""Measuring a finished model: metric tables through Lightning, probabilities, and every protected image's
accounting with the release gate."""
