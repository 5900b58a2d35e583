"""`python -m ttp_lightning.plots`: the command line of ttp_lightning.reporting.plots."""

import sys

from ttp_lightning.reporting.plots import main

if __name__ == "__main__":
    sys.exit(main())
