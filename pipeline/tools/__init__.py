"""One-time user tools (``python -m pipeline.tools.<tool>``); not stages, not imported by the task list."""
