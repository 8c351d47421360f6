"""The episode recorder: what a run keeps of some episodes besides ``episodes.jsonl``, in PlugRL's layout.

For every K-th episode of a process (``--recorder.episode-freq K``) the recorder keeps copies of the episode's
observations while it runs and, once it ends, writes under the process folder (``rollout/proc_NNN/``)::

    sampled/ep_NNNNNN/env_EEE/obs/{first,last}/images/{key}.png   each image key (uint8, 1 to 4 channels; .npy else)
    sampled/ep_NNNNNN/env_EEE/obs/{first,last}/states/{key}.npy   each state key
    sampled/ep_NNNNNN/env_EEE/obs/{first,last}/text.txt           the text (empty when the env gives none)
    sampled/ep_NNNNNN/env_EEE/obs/last/info.json                  the env's part of the last step's info
    videos/epNNNNNN_envEEE_{key}.mp4     --recorder.record-video: each image key, H.264
    rollouts/epNNNNNN_envEEE.npz         --recorder.record-full-rollout
    metrics/obs_stats.jsonl              --recorder.record-obs-stats (on): PlugRL's line per episode
    metrics/episode_metrics.jsonl        --recorder.record-episode-metrics (on): PlugRL's line per episode

``NNNNNN`` is the episode's number by completion in its process (the process's count of completed episodes when
it ended, from 1, as PlugRL numbers it), ``EEE`` the env's index in the process. Keys are used in file names with
every character outside ``[A-Za-z0-9._-]`` replaced by ``_``. The JSON lines start with PlugRL's fields
(``completed_episode``, ``process_id``, ``env_id``, ``env_episode_id``: the env's own episode number from 1); ours
follow them.

JSON files are strict JSON (NaN and infinities become null; statistics are over an array's finite values, with
``non_finite`` counting the others); ``.npy`` and ``.npz`` files hold the arrays as the env produced them.

One module per concept: :mod:`.config` (the ``--recorder.*`` flags), :mod:`.recorder` (the rollout's side: which
episodes, copying their observations), :mod:`.episode` (a recorded episode's data, as handed from one side to the
other), :mod:`.writer` (the hand-off and the writer thread that writes the files), :mod:`.sinks` (where files go),
:mod:`.encoders` (PNG, MP4, NPY), :mod:`.statistics` (the per-key statistics of ``obs_stats.jsonl``) and
:mod:`.summary` (what the recorder did over a run).
"""
