"""Shoal's Slurm backend: the same CreateTrainingJob request run on a Slurm cluster (as
SageMaker HyperPod runs Slurm), through the cluster's own commands.

    devcluster  a real Slurm cluster on this machine (``make slurm-up``), nodes in namespaces
"""
