"""``python -m examples.customer_service [--check]``: regenerate (or check) the committed data files."""

from .data import main

raise SystemExit(main())
