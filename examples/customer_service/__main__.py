"""``python -m examples.customer_service [--check]``: regenerate (or check) the committed data files.

``python -m examples.customer_service demos --out FILE --count N``: write the reference solver's episodes on N
train tickets as warm-start data (``demos.py``).
"""

import sys

from . import data, demos

COMMANDS = {"demos": demos.main}  # subcommand -> its main; no subcommand: the data files

args = sys.argv[1:]
if args and args[0] in COMMANDS:
    raise SystemExit(COMMANDS[args[0]](args[1:]))
raise SystemExit(data.main(args))
