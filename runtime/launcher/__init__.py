"""The in-job launcher (`train`): the /opt/ml contract, runners and mpirun across hosts.

Modules, one concept each:

* :mod:`~shoal.launcher.paths` the /opt/ml layout (``SAGEMAKER_BASE_DIR`` when set);
* :mod:`~shoal.launcher.hyperparameters` decoding, framework/user split, ``--key value``;
* :mod:`~shoal.launcher.environment` the config files and the ``SM_*`` variables;
* :mod:`~shoal.launcher.extract` and :mod:`~shoal.launcher.source` fetching ``code/``
  (s3, directory, tarball; refused whole when a member would escape) and pip installs;
* :mod:`~shoal.launcher.runners` runner precedence, torchrun argv, ``TF_CONFIG``;
* :mod:`~shoal.launcher.mpi` the mpirun argv of the MPI and data-parallel runners;
* :mod:`~shoal.launcher.rank` ``shoal-rank``, the per-rank wrapper and its environment;
* :mod:`~shoal.launcher.hostname` the ``gethostname`` shim preloaded into ranks;
* :mod:`~shoal.launcher.supervisor` running the job's process tree, tags, stop;
* :mod:`~shoal.launcher.failure` ``output/success`` and the 1024-character failure text;
* :mod:`~shoal.launcher.cluster` sshd, readiness and the outcome shared by every host;
* :mod:`~shoal.launcher.simulate` several hosts on one machine (``run_job``);
* :mod:`~shoal.launcher.entrypoint` ``train`` itself.
"""
