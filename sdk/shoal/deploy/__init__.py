"""Deploying a trained model: models, endpoints, predictors, and the model server.

- ``modelserver``: the inference containers' contract (``/ping``, ``/invocations``, the
  PyTorch inference toolkit's handlers), run inside Shoal's inference images and, with
  ``instance_type="local"``, as processes on this machine.
"""
