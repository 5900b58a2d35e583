"""User-facing errors: raised for bad input, printed as one line by the entry point."""


EXIT_NOT_PROTECTED = 4  # the run finished, but its release gate failed (assess/protection.py): not released as protected


class TTPUserError(Exception):
    """A problem with the user's input (config values, files, names) rather than a bug."""
