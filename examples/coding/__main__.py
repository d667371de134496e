"""``python -m examples.coding [--check]``: regenerate (or check) the committed task files."""

from .data import main

raise SystemExit(main())
