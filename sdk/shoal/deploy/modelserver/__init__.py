"""The model server: what a SageMaker inference container does, without TorchServe or Java.

An endpoint's container gets ``serve``: it answers ``GET /ping`` and ``POST /invocations``
on ``SAGEMAKER_BIND_TO_PORT`` (8080), the model extracted in ``/opt/ml/model`` and the
user's code in ``/opt/ml/model/code``. The handler contract is the SageMaker inference
toolkit's, with the PyTorch toolkit's defaults:

- codecs.py: the content types and their decoders and encoders (json, csv, npy, npz).
- handlers.py: the user's module (``SAGEMAKER_PROGRAM``), its ``model_fn``, ``input_fn``,
  ``predict_fn``, ``output_fn`` or ``transform_fn`` (each with an optional ``context``),
  the defaults, and one request through them.
- app.py: the HTTP side (Starlette): ping, invocations, status codes, time-outs.
- main.py: ``serve``: the settings from the environment, the port, the worker processes.

Errors (the toolkit's rule): an exception with an integer ``status_code`` (the toolkit's
``BaseInferenceToolkitError``, or Shoal's ``InferenceError``) answers that status with its
message; any other answers 500 with the message and the traceback.
"""
