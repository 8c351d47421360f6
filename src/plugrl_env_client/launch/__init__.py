"""Where rollout processes run: in this process, in local processes, or (extra ``ray``) as Ray actors."""
