"""Rules as the estimator's ``rules=`` takes them: :class:`ProfilerRule` (over the system and
framework metrics) and :class:`Rule` (over the tensors a Debugger hook saves), built from a
built-in configuration (``.sagemaker``) or an image of one's own (``.custom``).

A rule object holds what the user chose; :func:`profiler_rule_request` and
:func:`debug_rule_request` turn it into its entry of ``ProfilerRuleConfigurations`` /
``DebugRuleConfigurations`` for a region and a job, without changing it: the built-in image
is the region's ``sagemaker-debugger-rules``, whose instance type and volume the service picks.
"""

from __future__ import annotations

from typing import Any

from shoal.debugger.actions import is_valid_action_object
from shoal.debugger.hooks import CollectionConfig
from shoal.errors import DebuggerError

DEFAULT_RULE_EVALUATOR_IMAGE = "DEFAULT_RULE_EVALUATOR_IMAGE"
DETAILED_PROFILER_RULE = "DetailedProfilerProcessingJobConfig"
DETAILED_PROFILER_INSTANCE_TYPE = "ml.m5.4xlarge"
DETAILED_PROFILER_VOLUME_GB = 128

# The accounts holding the rule images, per region (sagemaker-debugger-rules:latest).
RULE_IMAGE_ACCOUNTS = {
    "af-south-1": "314341159256", "ap-east-1": "199566480951", "ap-northeast-1": "430734990657",
    "ap-northeast-2": "578805364391", "ap-northeast-3": "479947661362",
    "ap-south-1": "904829902805", "ap-southeast-1": "972752614525",
    "ap-southeast-2": "184798709955", "ca-central-1": "519511493484",
    "cn-north-1": "618459771430", "cn-northwest-1": "658757709296",
    "eu-central-1": "482524230118", "eu-north-1": "314864569078", "eu-south-1": "563282790590",
    "eu-west-1": "929884845733", "eu-west-2": "250201462417", "eu-west-3": "447278800020",
    "me-south-1": "986000313247", "sa-east-1": "818342061345", "us-east-1": "503895931360",
    "us-east-2": "915447279597", "us-gov-west-1": "515509971035", "us-west-1": "685455198987",
    "us-west-2": "895741380848",
}
# SageMaker Profiler's processing image (detailed-profiler-processing:latest).
DETAILED_PROFILER_ACCOUNTS = {
    "eu-central-1": "482524230118", "eu-west-1": "929884845733", "il-central-1": "216881608335",
    "us-east-1": "503895931360", "us-east-2": "915447279597", "us-west-2": "895741380848",
}


def get_rule_container_image_uri(name: str | None, region: str) -> str:
    """The built-in rule image of ``region`` (the detailed profiler's for its rule)."""
    detailed = bool(name) and name.startswith(DETAILED_PROFILER_RULE)
    accounts, repository = ((DETAILED_PROFILER_ACCOUNTS, "detailed-profiler-processing") if detailed
                            else (RULE_IMAGE_ACCOUNTS, "sagemaker-debugger-rules"))
    if region not in accounts:
        raise DebuggerError(f"'region' must be one where Debugger's {repository} image exists, "
                            f"{sorted(accounts)} (got {region!r})")
    domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"{accounts[region]}.dkr.ecr.{region}.{domain}/{repository}:latest"


def _custom_parameters(source, rule_to_invoke, rule_parameters, other_trials=None) -> dict:
    if bool(source) != bool(rule_to_invoke):
        raise DebuggerError("a custom rule takes 'source' and 'rule_to_invoke' together "
                            f"(got source={source!r}, rule_to_invoke={rule_to_invoke!r})")
    merged = {f"other_trial_{i}": uri for i, uri in enumerate(other_trials or ())}
    if source:
        merged["source_s3_uri"] = source
    if rule_to_invoke:
        merged["rule_to_invoke"] = rule_to_invoke
    merged.update(rule_parameters or {})
    return merged


class _RuleBase:
    def __init__(self, name, image_uri, instance_type, container_local_output_path,
                 s3_output_path, volume_size_in_gb, rule_parameters):
        if not isinstance(name, str) or not name:
            raise DebuggerError(f"'name' must be a non-empty str (got {name!r})")
        self.name = name
        self.image_uri = image_uri
        self.instance_type = instance_type
        self.container_local_output_path = container_local_output_path
        self.s3_output_path = s3_output_path
        self.volume_size_in_gb = volume_size_in_gb
        self.rule_parameters = rule_parameters

    @property
    def built_in(self) -> bool:
        return self.image_uri == DEFAULT_RULE_EVALUATOR_IMAGE

    def _request(self, region: str, parameters: dict | None) -> dict[str, Any]:
        image, instance, volume = self.image_uri, self.instance_type, self.volume_size_in_gb
        if self.built_in:
            image = get_rule_container_image_uri(self.name, region)
            if not self.name.startswith(DETAILED_PROFILER_RULE):
                instance = volume = None  # the service sizes its own rule jobs
        entry = {"RuleConfigurationName": self.name, "RuleEvaluatorImage": image}
        optional = {"InstanceType": instance, "VolumeSizeInGB": volume,
                    "LocalPath": self.container_local_output_path,
                    "S3OutputPath": self.s3_output_path, "RuleParameters": parameters}
        entry.update({k: v for k, v in optional.items() if v is not None})
        return entry

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, image_uri={self.image_uri!r})"


class ProfilerRule(_RuleBase):
    """A rule over the profiler's system and framework metrics."""

    @classmethod
    def sagemaker(cls, base_config, name=None, container_local_output_path=None,
                  s3_output_path=None, instance_type=None, volume_size_in_gb=None):
        """A built-in rule: ``ProfilerRule.sagemaker(rule_configs.CPUBottleneck())``."""
        if not hasattr(base_config, "rule_parameters"):
            raise DebuggerError("'base_config' must be a profiler rule configuration such as "
                                f"rule_configs.CPUBottleneck() (got {base_config!r})")
        used = name or base_config.rule_name
        if used.startswith(DETAILED_PROFILER_RULE):
            instance_type = instance_type or DETAILED_PROFILER_INSTANCE_TYPE
            volume_size_in_gb = volume_size_in_gb or DETAILED_PROFILER_VOLUME_GB
        return cls(used, DEFAULT_RULE_EVALUATOR_IMAGE, instance_type, container_local_output_path,
                   s3_output_path, volume_size_in_gb, dict(base_config.rule_parameters))

    @classmethod
    def custom(cls, name, image_uri, instance_type, volume_size_in_gb, source=None,
               rule_to_invoke=None, container_local_output_path=None, s3_output_path=None,
               rule_parameters=None):
        """A rule in an image of one's own (``source``: the rule's code, with ``rule_to_invoke``)."""
        return cls(name, image_uri, instance_type, container_local_output_path, s3_output_path,
                   volume_size_in_gb, _custom_parameters(source, rule_to_invoke, rule_parameters))


class Rule(_RuleBase):
    """A rule over the tensors the Debugger hook saves (losses, weights, gradients...)."""

    def __init__(self, name, image_uri, instance_type, container_local_output_path,
                 s3_output_path, volume_size_in_gb, rule_parameters, collections_to_save,
                 actions=None):
        super().__init__(name, image_uri, instance_type, container_local_output_path,
                         s3_output_path, volume_size_in_gb, rule_parameters)
        if actions is not None and not is_valid_action_object(actions):
            raise DebuggerError("'actions' must be a rule_configs action or ActionList "
                                f"(got {actions!r})")
        self.collection_configs = list(collections_to_save or [])
        self.actions = actions

    @classmethod
    def sagemaker(cls, base_config, name=None, container_local_output_path=None,
                  s3_output_path=None, other_trials_s3_input_paths=None, rule_parameters=None,
                  collections_to_save=None, actions=None):
        """A built-in rule: ``Rule.sagemaker(rule_configs.loss_not_decreasing())``."""
        if (rule_parameters or {}).get("rule_to_invoke") is not None:
            raise DebuggerError("'rule_parameters' must not set rule_to_invoke for a built-in "
                                "rule: it names the rule itself (use Rule.custom for your own)")
        try:
            config = base_config["DebugRuleConfiguration"]
        except (TypeError, KeyError):
            raise DebuggerError("'base_config' must be a debug rule configuration such as "
                                f"rule_configs.loss_not_decreasing() (got {base_config!r})") from None
        merged = {f"other_trial_{i}": uri for i, uri in enumerate(other_trials_s3_input_paths or ())}
        merged.update(config.get("RuleParameters", {}))
        merged.update(rule_parameters or {})
        collections = [CollectionConfig(c.get("CollectionName"), c.get("CollectionParameters") or {})
                       for c in base_config.get("CollectionConfigurations", [])]
        return cls(name or config.get("RuleConfigurationName"), DEFAULT_RULE_EVALUATOR_IMAGE,
                   None, container_local_output_path, s3_output_path, None, merged,
                   collections_to_save or collections, actions)

    @classmethod
    def custom(cls, name, image_uri, instance_type, volume_size_in_gb, source=None,
               rule_to_invoke=None, container_local_output_path=None, s3_output_path=None,
               other_trials_s3_input_paths=None, rule_parameters=None, collections_to_save=None,
               actions=None):
        """A rule in an image of one's own."""
        params = _custom_parameters(source, rule_to_invoke, rule_parameters,
                                    other_trials_s3_input_paths)
        return cls(name, image_uri, instance_type, container_local_output_path, s3_output_path,
                   volume_size_in_gb, params, collections_to_save or [], actions)


def local_source(rule) -> str | None:
    """A custom rule's ``source`` when it is a local file (uploaded with the job's code)."""
    source = (rule.rule_parameters or {}).get("source_s3_uri")
    return source if isinstance(source, str) and not source.startswith("s3://") else None


def _parameters(rule, sources: dict[str, str]) -> dict[str, str]:
    params = {k: str(v) for k, v in (rule.rule_parameters or {}).items() if k != "action_json"}
    if local_source(rule) and rule.name in sources:
        params["source_s3_uri"] = sources[rule.name]
    return params


def profiler_rule_request(rule: ProfilerRule, region: str,
                          sources: dict[str, str] | None = None) -> dict[str, Any]:
    """The rule's ``ProfilerRuleConfigurations`` entry: every parameter a string, as v2 sends;
    ``sources``: where local rule sources are uploaded, by rule name."""
    return rule._request(region, _parameters(rule, sources or {}) or None)


def debug_rule_request(rule: Rule, region: str, job_name: str,
                       sources: dict[str, str] | None = None) -> dict[str, Any]:
    """The rule's ``DebugRuleConfigurations`` entry (its actions as ``action_json``).

    Every parameter is sent as a string: the API's RuleParameters map holds strings only (v2
    sends ``num_steps=10`` as an int, which botocore refuses before the request leaves)."""
    params = _parameters(rule, sources or {})
    if rule.actions is not None:
        params["action_json"] = rule.actions.with_job_prefix(job_name).serialize()
    return rule._request(region, params or None)
