"""The attention explorer page: size and render time."""
