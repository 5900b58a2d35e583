"""`python -m ttp_lightning.verify`: the verifiers' command line (ttp_lightning.verify.main)."""

import sys

from ttp_lightning.verify import main

sys.exit(main())
