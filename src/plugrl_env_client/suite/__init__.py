"""``plugrl-run-suite SUITE.toml [client flags]``: many tasks, one command, one table.

:mod:`~plugrl_env_client.suite.spec` reads a suite file, :mod:`~plugrl_env_client.suite.runner` runs its tasks
(each a client run of its own) and writes the table, :mod:`~plugrl_env_client.suite.cli` is the command. It sits on
top, beside the client's command: nothing else in the package imports it.
"""
