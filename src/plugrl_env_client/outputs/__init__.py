"""What a run leaves on disk: ``runs/<exp-name>/`` with configs, logs, episodes and summaries."""
