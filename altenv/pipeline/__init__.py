"""The run pipeline, a module per kind of run (``altenv train``: :mod:`.train`)."""
