"""Launching: how the worker processes get started, here or on a cluster.

``local`` (torch's elastic agent on this host), ``slurm`` (inside an allocation: srun or one
torchrun per node), ``rendezvous`` (where the ranks meet, per site), ``submit`` (the sbatch
script), the containers (``container_build``, ``container_def``, ``container_launch``,
``container_inside``) and ``environment`` (the Python and torch this host has). Imports the
worker side, settings and the contract, never commands.
"""
