"""The command line and `attnlab verify`: startup time, tolerance margins."""
