"""The tasks: one module per kind of training run (`attnlab train TASK`), each a
:class:`attnlab.runs.task.Task`, registered in :mod:`attnlab.runs.registry` (docs/extending.md)."""
