"""``python -m examples.sql_agent [--check]``: regenerate (or check) the committed data files."""

from .data import main

raise SystemExit(main())
