"""Reference policy server: speaks PlugRL v1, serves simple policies, and doubles as the embedded default."""
