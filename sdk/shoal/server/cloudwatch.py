"""The CloudWatch metrics API over the local jobs' training metrics (``shoal.local.metrics``):
``GetMetricStatistics``, ``ListMetrics`` and ``GetMetricData`` in namespace
``/aws/sagemaker/TrainingJobs`` with the one dimension SageMaker publishes algorithm metrics
under, ``TrainingJobName``. CloudWatch matches exact dimension sets, so any other set (or
namespace) has no datapoints, as on AWS.

Datapoints fall in buckets of ``Period`` seconds counted from ``StartTime``; a bucket's
timestamp is its start. This is what SageMaker SDK v2's ``TrainingJobAnalytics`` reads
(``GetMetricStatistics`` with Period 60 and the Average).
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

from shoal.local import metrics

from .api_errors import ApiError

NAMESPACE = "/aws/sagemaker/TrainingJobs"
DIMENSION = "TrainingJobName"
LIST_PAGE = 500  # ListMetrics' page size on AWS


class InvalidParameterCombination(ApiError):
    code, status = "InvalidParameterCombination", 400


class InvalidParameterValue(ApiError):
    code, status = "InvalidParameterValue", 400


class CloudWatchApi:
    def __init__(self, root: Path, region: str = "us-east-1"):
        self.root, self.region = Path(root), region

    # -- operations ----------------------------------------------------------------------
    def GetMetricStatistics(self, params: dict) -> dict:  # noqa: N802 - the API's names
        stats, extended = params.get("Statistics") or [], params.get("ExtendedStatistics") or []
        if bool(stats) == bool(extended):
            raise InvalidParameterCombination("Must specify either Statistics or "
                                              "ExtendedStatistics, but not both.")
        start, end, period = _window(params)
        values = self._values(params["Namespace"], params["MetricName"],
                              params.get("Dimensions") or [], start, end)
        points = [_datapoint(start + dt.timedelta(seconds=slot * period), bucket, stats, extended)
                  for slot, bucket in sorted(_buckets(values, start, period).items())]
        return {"Label": params["MetricName"], "Datapoints": points}

    def ListMetrics(self, params: dict) -> dict:  # noqa: N802
        if params.get("Namespace", NAMESPACE) != NAMESPACE:
            return {"Metrics": []}
        found = [{"Namespace": NAMESPACE, "MetricName": name,
                  "Dimensions": [{"Name": DIMENSION, "Value": job_dir.name}]}
                 for job_dir in self._job_dirs()
                 for name in metrics.by_metric(metrics.read(job_dir))
                 if params.get("MetricName", name) == name]
        found = [m for m in found if _dimensions_match(m["Dimensions"],
                                                       params.get("Dimensions") or [])]
        token = params.get("NextToken") or "0"
        if not token.isdigit():
            raise InvalidParameterValue("Invalid NextToken")
        start = int(token)
        out = {"Metrics": found[start:start + LIST_PAGE]}
        if start + LIST_PAGE < len(found):
            out["NextToken"] = str(start + LIST_PAGE)
        return out

    def GetMetricData(self, params: dict) -> dict:  # noqa: N802
        start, end = _time(params["StartTime"]), _time(params["EndTime"])
        newest_first = params.get("ScanBy", "TimestampDescending") == "TimestampDescending"
        results = []
        for query in params["MetricDataQueries"]:
            if "MetricStat" not in query:
                raise InvalidParameterValue("Shoal's endpoint answers MetricStat queries only "
                                            "(no metric math Expression)")
            if query.get("ReturnData", True):
                results.append(self._query(query, start, end, newest_first))
        return {"MetricDataResults": results, "Messages": []}

    # -- helpers -------------------------------------------------------------------------
    def _query(self, query: dict, start, end, newest_first: bool) -> dict:
        stat, metric = query["MetricStat"], query["MetricStat"]["Metric"]
        out = self.GetMetricStatistics({
            "Namespace": metric.get("Namespace", ""), "MetricName": metric.get("MetricName", ""),
            "Dimensions": metric.get("Dimensions") or [], "StartTime": start, "EndTime": end,
            "Period": stat["Period"], **_statistic(stat["Stat"])})
        rows = sorted(((p["Timestamp"], _value(p)) for p in out["Datapoints"]),
                      reverse=newest_first)
        return {"Id": query["Id"], "Label": query.get("Label", out["Label"]),
                "Timestamps": [t for t, _ in rows], "Values": [v for _, v in rows],
                "StatusCode": "Complete"}

    def _values(self, namespace, name, dimensions, start, end) -> list[tuple]:
        job = _job_of(namespace, dimensions)
        if job is None or not (self.root / job).is_dir():
            return []
        return [(p.time, p.value) for p in metrics.read(self.root / job)
                if p.metric == name and start <= p.time < end]

    def _job_dirs(self) -> list[Path]:
        try:
            return sorted(d for d in self.root.iterdir() if (d / "job.json").exists())
        except FileNotFoundError:
            return []


def _job_of(namespace: str, dimensions: list[dict]) -> str | None:
    """The job an exact ``[TrainingJobName]`` dimension set names, else None."""
    if namespace != NAMESPACE or len(dimensions) != 1 or dimensions[0]["Name"] != DIMENSION:
        return None
    return dimensions[0].get("Value")


def _dimensions_match(have: list[dict], wanted: list[dict]) -> bool:
    mine = {d["Name"]: d["Value"] for d in have}
    return all(w["Name"] in mine and w.get("Value", mine[w["Name"]]) == mine[w["Name"]]
               for w in wanted)


def _time(value) -> dt.datetime:
    """JSON carries epoch seconds; ISO-8601 strings are taken too."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    if isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(value, dt.timezone.utc)
    return _time(dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")))


def _window(params: dict):
    start, end, period = _time(params["StartTime"]), _time(params["EndTime"]), params["Period"]
    if start >= end:
        raise InvalidParameterValue("The parameter StartTime must be less than the parameter "
                                    "EndTime.")
    if period < 1 or (period >= 60 and period % 60) or (period < 60 and period not in (1, 5, 10, 30)):
        raise InvalidParameterValue("The parameter Period must be 1, 5, 10, 30 or a multiple "
                                    "of 60.")
    return start, end, period


def _buckets(values: list[tuple], start, period: int) -> dict[int, list[float]]:
    buckets: dict[int, list[float]] = {}
    for at, value in values:
        buckets.setdefault(int((at - start).total_seconds() // period), []).append(value)
    return buckets


def _datapoint(at, values: list[float], stats, extended) -> dict:
    every = {"SampleCount": float(len(values)), "Sum": sum(values), "Minimum": min(values),
             "Maximum": max(values), "Average": sum(values) / len(values)}
    point = {"Timestamp": at, "Unit": "None", **{s: every[s] for s in stats}}
    if extended:
        point["ExtendedStatistics"] = {p: _percentile(values, p) for p in extended}
    return point


def _percentile(values: list[float], name: str) -> float:
    """``pNN``: the nearest-rank percentile."""
    try:
        share = float(name[1:]) if name.startswith("p") else math.nan
    except ValueError:
        share = math.nan
    if not 0 <= share <= 100:
        raise InvalidParameterValue(f"The value {name} for parameter ExtendedStatistics is not "
                                    f"supported (Shoal serves pNN percentiles).")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share / 100 * len(ordered)) - 1)]


def _statistic(stat: str) -> dict:
    names = ("SampleCount", "Average", "Sum", "Minimum", "Maximum")
    return {"Statistics": [stat]} if stat in names else {"ExtendedStatistics": [stat]}


def _value(point: dict) -> float:
    plain = [v for k, v in point.items() if k not in ("Timestamp", "Unit", "ExtendedStatistics")]
    return plain[0] if plain else next(iter(point["ExtendedStatistics"].values()))
