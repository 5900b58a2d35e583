"""User-facing errors: raised for bad input, printed as one line by the entry point."""


class TTPUserError(Exception):
    """A problem with the user's input (config values, files, names) rather than a bug."""
