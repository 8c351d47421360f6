"""``python -m plugrl_env_client.suite``: the same as ``plugrl-run-suite``."""

from plugrl_env_client.suite.cli import main

if __name__ == "__main__":
    main()
