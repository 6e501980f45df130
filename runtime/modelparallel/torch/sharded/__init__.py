"""Sharded data parallelism (SMP's ``sharded_data_parallel_degree``): ZeRO-3 within groups.

The data-parallel ranks that hold the same model replica (the reduced-data-parallel group,
one per tensor-parallel rank) are cut into sharding groups of
``sharded_data_parallel_degree`` consecutive ranks, as MiCS does: inside a group every
parameter, its gradient and its optimizer state are split in equal chunks, one per rank;
the groups are replicas of each other.

- groups.py: the sharding groups, their replicas and their communicators.
- layout.py: where a parameter's elements live (pure arithmetic).
- params.py: the parameters' life: sharded at rest, gathered with the core's allgather
  before a module's forward and backward (prefetched within ``sdp_max_live_parameters``),
  released after.
- grads.py: gradients reduce-scattered in buckets of ``sdp_reduce_bucket_size`` elements
  as the backward produces them, averaged across the replicas at the step's end.
- optimizer.py: ``smp.DistributedOptimizer`` under SDP: the user's optimizer steps each
  group's flat float32 partition (DeepSpeed's ``fp32_partitioned_groups_flat``), with
  gradient clipping (``sdp_gradient_clipping``) and fp16/bf16 loss scaling inside ``step()``.
- checkpoint.py: per-shard checkpoints (``model_{r}.pt`` / ``optimizer_{r}.pt``) and
  full ones.
"""
