"""``python -m draftsmith.cli``: the ``draftsmith`` command."""

import sys

from draftsmith.cli import main

sys.exit(main())
