"""``shoal serve``: an endpoint that speaks the SageMaker API (JSON 1.1, ``SageMaker.<Op>``) and
the CloudWatch Logs API (``Logs_20140328.<Op>``) for training jobs, running them on the local
backend, and CloudWatch's metrics API (JSON 1.0, ``GraniteServiceVersion20100801.<Op>``) for
their training metrics, so that boto3, the AWS CLI and SageMaker SDK v2 run jobs here unchanged::

    sdk -> server (protocol, signing, api_errors) -> training_jobs / logs_api / cloudwatch
        -> local backend
"""
