"""``python -m worker`` is the ``streamfer`` command."""

from worker.cli import main

raise SystemExit(main())
