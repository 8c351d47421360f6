"""Rules 6 and 7: NaN and inf, and the layout of images and states, over the shared run."""

from __future__ import annotations

import broken_envs as b

from plugrl_env_client.check import check_env


def test_rule6_nan_rewards() -> None:
    report = check_env(b.NanRewardEnv())
    b.assert_caught(report, 6, "fail", "rewards were NaN or inf at steps 2, 6", "(envs [1] at step 2)",
                    "--runner.non-finite-rewards zero")


def test_rule6_rewards_beyond_float32_are_named_as_such_not_as_nan() -> None:
    report = check_env(b.HugeRewardEnv())
    result = report.result(6)
    assert result.status == "fail", report.render(details=True)
    for words in ("rewards did not fit float32 at steps 2, 5, 8", "(1e+39 for envs [0] at step 2; float32's largest "
                  "is 3.40282e+38)", "scale the rewards into float32's range", "--runner.non-finite-rewards zero"):
        assert words in f"{result.seen} | {result.fix}", report.render(details=True)
    assert "NaN" not in result.seen
    assert report.result(5).status == "warn"  # float64 rewards: the only other rule it breaks


def test_rule6_inf_observations() -> None:
    report = check_env(b.NanStateEnv())
    b.assert_caught(report, 6, "fail", "states['pos'] held NaN or inf at step 2 (envs [0])",
                    "--runner.non-finite-observations allow")


def test_rule7_float_images() -> None:
    report = check_env(b.FloatImageEnv())
    result = b.assert_caught(report, 7, "fail", "reset(seed=0) returned images['cam'] of dtype float32 and shape "
                             "(2, 4, 4, 3); images must be uint8 (n, height, width, channels)", ".astype(np.uint8)")
    assert result.seen.count("images['cam']") == 1  # once for the run, at the first observation that showed it


def test_rule7_channels_first_images() -> None:
    report = check_env(b.ChannelsFirstEnv())
    b.assert_caught(report, 7, "fail", "images['cam'] has shape (2, 3, 8, 8), which looks channels-first",
                    "np.moveaxis(img, 1, -1)")
