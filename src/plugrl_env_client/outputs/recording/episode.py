"""A recorded episode's data: observation rows copied out of the batch while it runs, and, once it ends, what the
rollout's side hands to the writer thread."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.records import EpisodeRecord


@dataclasses.dataclass
class Frame:
    """One observation row of one env, copied out of the batch."""

    images: dict[str, np.ndarray]
    states: dict[str, np.ndarray]
    text: str

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.images.values()) + sum(a.nbytes for a in self.states.values())


def copy_row(obs: Observation, row: int) -> Frame:
    """Copies (never views) of row ``row`` of every array, so later changes to the batch do not reach them."""
    return Frame(
        images={k: np.array(v[row]) for k, v in obs.images.items()},
        states={k: np.array(v[row]) for k, v in obs.states.items()},
        text=str(obs.text[row]),
    )


@dataclasses.dataclass
class RecordedEpisode:
    """A recorded episode in progress: its first and latest observation, and the steps kept."""

    env_id: int
    env_episode: int
    """The env's own episode number, from 1."""
    first: Frame
    last: Frame
    steps: list[Frame] = dataclasses.field(default_factory=list)
    actions: list[np.ndarray] = dataclasses.field(default_factory=list)
    rewards: list[float] = dataclasses.field(default_factory=list)
    num_steps: int = 0
    nbytes: int = 0
    completed: int = 0
    """The process's count of completed episodes when this one ended (its number by completion, from 1)."""

    @property
    def stem(self) -> str:
        """The episode in flat file names (videos, rollouts)."""
        return f"ep{self.completed:06d}_env{self.env_id:03d}"

    @property
    def folder(self) -> str:
        """The episode's folder under ``sampled/``, as PlugRL's client names it."""
        return f"sampled/ep_{self.completed:06d}/env_{self.env_id:03d}"

    @property
    def frames(self) -> list[Frame]:
        """The observations kept, first one included."""
        return [self.first, *self.steps]


@dataclasses.dataclass
class FinishedEpisode:
    """A recorded episode that ended, with what its files need besides its frames: the writer thread's job."""

    episode: RecordedEpisode
    record: EpisodeRecord
    info: dict[str, Any]
    """The env's part of the info of the episode's last step, JSON-safe."""
    means: dict[str, float]
    """``mean_return`` and ``mean_success_rate`` over the metric window when the episode ended (PlugRL's floats)."""
