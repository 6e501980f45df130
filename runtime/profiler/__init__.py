"""Shoal's profiler: what SageMaker Debugger's profiling does around a training job.

``rule_table`` is the contract both sides read: the SDK validates ``rules=`` against it at
submit time, and the rule engine reads the same names, defaults and limits (and parses the
string values the request carries) when a job runs.
"""
