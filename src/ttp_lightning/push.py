"""`python -m ttp_lightning.push`: the command line of ttp_lightning.release.push."""

import sys

from ttp_lightning.release.push import main

if __name__ == "__main__":
    sys.exit(main())
