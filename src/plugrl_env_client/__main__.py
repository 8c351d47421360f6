"""``python -m plugrl_env_client <env-id> ...`` is the same as ``plugrl-run-env-client <env-id> ...``."""

from plugrl_env_client.cli import main

if __name__ == "__main__":
    main()
