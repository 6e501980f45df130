"""The model-parallel runtime's errors, one tree.

    SMPError                        every error of the runtime
    ├── SMPConfigError (ValueError)     a parameter that is unknown, mistyped or out of range
    │   └── SMPUnsupportedError         a parameter Shoal's runtime does not implement
    ├── SMPNotInitializedError          an API used before ``smp.init()``
    ├── SMPUsageError                   an API used where SMP does not allow it (forward or
    │   │                               backward outside ``smp.step``, a second DistributedModel)
    │   ├── TPModuleRegisterError       ``smp.tp_register`` of a class that is no DistributedModule
    │   ├── InvalidSeqLenPrescaledBatchError  a prescaled batch's sequence the TP degree does
    │   │                               not divide (the LM head splits it over the group)
    │   └── CheckpointingError          activation checkpointing that cannot apply (a module
    │                                   split over manual pipeline partitions, a dict output)
    ├── SMPPartitionError               a placement that cannot be honoured (modules sharing a
    │                                   parameter split apart, a model too small to split)
    ├── DDPNotEnabledError              a torch process group asked for without ``ddp: True``
    ├── SMPCheckpointError              a checkpoint that does not fit this model's partitions
    └── SMPPeerError                    a pipeline peer failed while this rank waited on it

A batch that the microbatches do not divide is a plain ``ValueError``, as in SMP.
"""


class SMPError(Exception):
    """Base of every error the model-parallel runtime raises."""


class SMPConfigError(SMPError, ValueError):
    """A configuration parameter is unknown, of the wrong type or out of range."""


class SMPUnsupportedError(SMPConfigError):
    """A configuration parameter that Shoal's runtime does not implement."""


class SMPNotInitializedError(SMPError, RuntimeError):
    def __init__(self, message: str = "smp is not initialized!") -> None:
        super().__init__(message)


class SMPUsageError(SMPError, RuntimeError):
    """An API called where the library does not allow it."""


class TPModuleRegisterError(SMPUsageError):
    """A distributed module to register that does not subclass smp.nn.DistributedModule."""


class InvalidSeqLenPrescaledBatchError(SMPUsageError, ValueError):
    """With ``prescaled_batch``, a sequence length the TP degree does not divide."""


class CheckpointingError(SMPUsageError):
    """A module checkpointed where its activations cannot be recomputed as one piece."""


class SMPPartitionError(SMPError, RuntimeError):
    """The model cannot be partitioned as asked."""


class DDPNotEnabledError(SMPError, RuntimeError):
    def __init__(self, message: str = (
        "Torch.dist is not initialized. Please enable DDP in config to use torch.dist"
    )) -> None:
        super().__init__(message)


class SMPCheckpointError(SMPError, RuntimeError):
    """A checkpoint that cannot be loaded into this model."""


class SMPPeerError(SMPError, RuntimeError):
    """A pipeline peer failed or went away during a step."""
