"""The checkpoint room: save a run's whole training state and resume it, safely.

- ``checkpoint``: save and restore (sharded, any number of ranks), the run directory's
  ``checkpoints/`` and ``latest``; ``checkpoint_writer``: writing synchronously or
  (``--async-checkpoint``) beside training; ``checkpoint_manifest``: every file's size
  and sha256, written last.
- ``checkpoint_choice``: which checkpoint a resume uses (the newest that verifies), and
  loading one into a plain model; ``resume``: where a run starts.
- ``safe_load``: reading checkpoint files without running code from them.
- ``write_errors``: a write into the run directory that fails, told in one line.
"""
