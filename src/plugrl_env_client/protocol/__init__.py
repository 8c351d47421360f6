"""Everything that knows the PlugRL wire protocol v1 and nothing about envs or rollouts."""
