"""``python -m mtrl_runtime.cli``: the ``mtrl`` command."""

import sys

from . import console

sys.exit(console())
