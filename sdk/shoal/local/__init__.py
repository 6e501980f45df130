"""Shoal's local mode: a training job run as real processes on this machine.

``layout`` (pure: the job tree and config files from a request), ``storage`` (file:// and s3://
transfers), ``state`` (the DescribeTrainingJob-shaped record kept in the job directory),
``runner`` (the supervisor process of one job), ``metrics`` (training metrics from the hosts'
output) and ``process`` (process-tree control).
"""
