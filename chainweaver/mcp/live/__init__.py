"""Following the registry while serving: list cursors per caller view, and telling
clients what changed in their view."""
