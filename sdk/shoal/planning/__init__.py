"""Planning a job before it runs.

* :mod:`shoal.planning.advisor` -- the distributed libraries' tips and pitfalls, checked against
  a job (the checks: :mod:`~shoal.planning.job_checks`, :mod:`~shoal.planning.region_checks`,
  :mod:`~shoal.planning.script_checks`);
* :mod:`shoal.planning.sizing` -- FSx capacity, learning-rate scaling, microbatch counts and
  rank layout;
* :mod:`shoal.planning.strategy` -- the strategy planner: the data, pipeline, tensor and
  sharded data parallel degrees (and microbatches, checkpointing) a model should train with
  on a cluster, from a model of its memory and step time (:mod:`~shoal.planning.models`,
  :mod:`~shoal.planning.tracing`, :mod:`~shoal.planning.instances`,
  :mod:`~shoal.planning.costs`).
"""
