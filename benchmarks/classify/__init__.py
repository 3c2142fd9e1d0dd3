"""Chinese review sentiment: the classifier presets, classical baselines, lexicon studies."""
