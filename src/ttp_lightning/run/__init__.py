"""One run from settings to results: the value checks before any work, then the pipeline's stages."""
