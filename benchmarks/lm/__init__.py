"""The character-level GPT: presets, speed, speedrun, positions, attention variants, norms."""
