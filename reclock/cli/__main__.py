"""``python -m reclock.cli``: the ``reclock`` command without its console script on ``PATH``."""

import sys

from reclock.cli.main import main

sys.exit(main())
