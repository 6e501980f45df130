"""Planning a job before it runs.

* :mod:`shoal.planning.advisor` -- the distributed libraries' tips and pitfalls, checked against
  a job;
* :mod:`shoal.planning.sizing` -- FSx capacity, learning-rate scaling, microbatch counts and
  rank layout;
* :mod:`shoal.planning.strategy` -- the strategy planner: the data, pipeline, tensor and
  sharded data parallel degrees (and microbatches, checkpointing) a model should train with
  on a cluster, from a model of its memory and step time.
"""
