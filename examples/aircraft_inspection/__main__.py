"""``python -m examples.aircraft_inspection [--check]``: regenerate (or check) the committed data files."""

from .data import main

raise SystemExit(main())
