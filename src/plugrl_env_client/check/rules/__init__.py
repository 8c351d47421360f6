"""The rules of ``plugrl-check-env``, in the order they run: :data:`RULES`.

Each rule is one function of a :class:`~plugrl_env_client.check.harness.Context` whose docstring starts with its
number and says what it checks; the modules group them by what they look at: :mod:`.setup` (1, 2),
:mod:`.returns` (3-5), :mod:`.observations` (6, 7), :mod:`.episodes` (8-10), :mod:`.info` (11, 12) and
:mod:`.ending` (13, 14). Rules 2, 3, 5, 6, 7 and 11 apply the env contract the rollout applies on every step
(:mod:`plugrl_env_client.envs.contract`); the others need more than one call to see.
"""

from plugrl_env_client.check.harness import Rule
from plugrl_env_client.check.rules.ending import rule_close, rule_rollout
from plugrl_env_client.check.rules.episodes import rule_no_reset_in_step, rule_partial_reset, rule_time_limit
from plugrl_env_client.check.rules.info import rule_info, rule_metric_keys
from plugrl_env_client.check.rules.observations import rule_finite, rule_layout
from plugrl_env_client.check.rules.returns import rule_reset_returns, rule_seeding, rule_step_returns
from plugrl_env_client.check.rules.setup import rule_action_space, rule_constructs

RULES: tuple[Rule, ...] = (
    Rule(1, "constructs from its default config", rule_constructs),
    Rule(2, "single_action_space is a gymnasium Space, and sampled actions step", rule_action_space),
    Rule(3, "reset(seed=...) returns (Observation, dict) with one row per env", rule_reset_returns),
    Rule(4, "same seed, same first observation; different seeds, different ones", rule_seeding, (3,)),
    Rule(5, "step returns (obs, rewards float32 (n,), terminated bool (n,), truncated bool (n,), info dict)",
         rule_step_returns, (2, 3)),
    Rule(6, "no NaN or inf in rewards or observations; rewards fit float32", rule_finite, (2, 3, 5)),
    Rule(7, "images uint8 (n, h, w, c); states numeric with the batch leading", rule_layout, (2, 3, 5)),
    Rule(8, "a partial reset changes only the listed rows and returns the whole batch", rule_partial_reset,
         (2, 3, 5)),
    Rule(9, "step never resets an env itself", rule_no_reset_in_step, (2, 3, 5)),
    Rule(10, "episodes end, consistently with the registered time limit", rule_time_limit, (2, 3, 5)),
    Rule(11, "info values are per-env arrays (leading dim n) or documented keys", rule_info, (2, 3, 5)),
    Rule(12, "info['metrics'] has the same keys on every step", rule_metric_keys, (2, 3, 5)),
    Rule(13, "close() twice is harmless", rule_close),
    Rule(14, "a short rollout against the embedded policy offered for its action space completes", rule_rollout),
)
"""The checklist, in order."""

__all__ = ["RULES"]
