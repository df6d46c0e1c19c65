"""``python -m wsrm_plugin``: the ``wsrm`` command (``python -m wsrm_plugin --version``)."""

import sys

from wsrm_plugin.cli import main

sys.exit(main())
