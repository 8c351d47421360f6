"""Everything that knows envs and action chunks, and nothing about bytes."""
