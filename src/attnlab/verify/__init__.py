"""``attnlab verify``: every parity check of the project, rerun against the installed oracles."""
