"""``python -m llmroute``: the same command line as ``llmroute``."""

from .cli import main

raise SystemExit(main())
