"""The Ray launcher (``--launcher ray``, extra ``ray``): each of ``--num-procs`` processes is a Ray actor.

Ray only places, supervises and reports: an actor runs the same rollout as a local process (its own env batch and
its own WebSocket to the policy server). What the actors report (finished episodes, timing, log lines, their
result, as the reports of :mod:`plugrl_env_client.launch.reports`) streams home to this process, the driver, which
feeds the run's :class:`RunWriter`, so the run folder looks as for a local run. Where the processes ran is added as
``ray_nodes.json`` (per node: processes, env steps, episodes, env-steps/s), and every forwarded log line names its
process and node (``proc_003@10.0.0.5``).

``--num-episodes`` stays exact through actor deaths: an episode counts when its record reaches the driver, and
actors claim episodes against leases the driver hands out (see :mod:`.budget`). An actor whose process dies
(killed, node lost) is restarted by Ray up to ``--ray.max-restarts`` times; the driver then starts a new epoch on
it with fresh seeds (seed + epoch x num_procs x num_envs, so no episode repeats an earlier one), and its recorded
episodes stay counted once. Beyond the limit the process is reported FAILED with the reason and the others go on.
A process that fails by itself (an env error, a server that refuses the run) stops the run, as locally.

Ctrl-C / SIGTERM: every actor is told to stop (it finishes its step and reports), the driver waits for their
reports (at most ``DRAIN_TIMEOUT_S``; a second signal stops waiting), kills what is left, and re-raises.

One module per concern: :mod:`.launcher` (the entry point, :class:`~.launcher.RayLauncher`), :mod:`.cluster`
(connecting to Ray), :mod:`.signals` (SIGINT / SIGTERM around Ray's calls), :mod:`.placement` (what a process asks
for, and where it goes), :mod:`.supervisor` (the driver's loop over the actors), :mod:`.nodes` (``ray_nodes.json``),
:mod:`.worker` (the actor), :mod:`.budget` (episode leases) and :mod:`.sources` (env files for the workers).
Importing this package imports no Ray: only connecting does (and the actor, on its worker).
"""
