"""Commands that act on finished runs and are not tasks: ``attnlab ablate``, ``prune``,
``quantize`` and ``export`` (the command line in :mod:`attnlab.cli` hands over to these)."""
