"""The observe room: what watches and records a run without changing its numbers.

- ``observers``: the few calls the training loop makes to everything below (begin and
  end of an epoch, each step, phases).
- ``progress``: rank 0's progress bar or lines; ``live``: every rank's live state file,
  what ``ddl watch`` reads; ``tensorboard_events``: the metrics as TensorBoard events.
- ``step_breakdown``: where a step's time goes (data wait, the step, host syncs);
  ``profiling``: ``--profile N`` with torch.profiler; ``utilisation``: the device's busy
  share, sampled in a background thread.
- ``activation_memory``: the bytes a step keeps for its backward (measured in the first
  steps of an epoch; the planner predicts the same quantity).
- ``results``: results.json, one run's configuration, measurements and outcome;
  ``container_record``: which image the run ran in.
"""
