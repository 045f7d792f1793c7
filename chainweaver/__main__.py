"""``python -m chainweaver``: the same as the ``chainweaver`` command."""

from .cli import main

raise SystemExit(main())
