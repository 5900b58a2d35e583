"""`python -m ttp_lightning.tables`: the command line of ttp_lightning.reporting.tables."""

import sys

from ttp_lightning.reporting.tables import main

if __name__ == "__main__":
    sys.exit(main())
