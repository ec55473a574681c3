"""``python -m draftsmith``: the ``draftsmith`` command."""

import sys

from draftsmith.cli import main

sys.exit(main())
