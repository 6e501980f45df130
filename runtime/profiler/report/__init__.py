"""The profiler report: one self-contained HTML page (``profiler-report.html``) from a job's
profiler data and its rules' reports: the job's summary, every rule's status with its
findings, evidence and fix, system usage, framework time by phase, and plots. No network,
no telemetry; everything is inline."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import jinja2
from shoal.profiler.data import Store
from shoal.profiler.engine import REPORT_DIR
from shoal.profiler.report import evidence
from shoal.profiler.rules import RULES, SHOAL_RULES

REPORT_FILE = "profiler-report.html"
_CLASSES = {**RULES, **SHOAL_RULES}


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _summary(store: Store) -> list[tuple[str, str]]:
    span = store.span()
    if span is None:
        return [("Data", "none was recorded")]
    steps = sorted((e.start, e.start + e.duration) for es in store.events.values() for e in es
                   if e.phase.startswith("Step:ModeKeys."))
    rows = [("Job start", _when(span[0])), ("Job end", _when(span[1])),
            ("Duration", f"{span[1] - span[0]:.1f} s"),
            ("Hosts", ", ".join(store.nodes))]
    if steps:
        total = max(span[1] - span[0], 1e-9)
        init, loop, final = steps[0][0] - span[0], steps[-1][1] - steps[0][0], span[1] - steps[-1][1]
        rows += [("Training loop", f"{loop:.1f} s ({100 * loop / total:.0f} %), {len(steps)} steps"),
                 ("Initialization", f"{init:.1f} s ({100 * init / total:.0f} %)"),
                 ("Finalization", f"{final:.1f} s ({100 * final / total:.0f} %)")]
    return rows


# OverallSystemUsage's categories: how the table names each, and its values' unit
USAGE = {"CPU": ("CPU utilization", "%"), "CPU memory": ("CPU memory used", "%"),
         "GPU": ("GPU utilization", "%"), "GPU memory": ("GPU memory used", "%"),
         "I/O": ("I/O wait", "%"), "Network": ("Network, received + sent", "B/s")}
USAGE_STATS = ("p50", "p95", "p99", "min", "max")


def _rate(value: float) -> str:
    """Bytes a second in decimal units, as network rates are quoted."""
    if abs(value) < 1000:
        return f"{value:.0f} B/s"
    for unit in ("kB/s", "MB/s"):
        value /= 1000
        if abs(value) < 1000:
            return f"{value:.2f} {unit}"
    return f"{value / 1000:.2f} GB/s"


def _usage_row(category: str, stats: dict) -> tuple[str, list[str]]:
    label, unit = USAGE.get(category, (category, ""))
    fmt = {"%": lambda v: f"{v:.1f} %", "B/s": _rate}.get(unit, lambda v: f"{v:.1f}")
    return label, [fmt(stats[k]) if k in stats else "-" for k in USAGE_STATS]


def _usage(details: dict) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """Each node's OverallSystemUsage statistics, each value with its unit, in USAGE's
    order (categories it does not know last)."""
    rank = {c: i for i, c in enumerate(USAGE)}
    out = []
    for node, cats in sorted(details.items()):
        if isinstance(cats, dict):
            names = sorted((c for c in cats if isinstance(cats[c], dict)),
                           key=lambda c: (rank.get(c, len(rank)), c))
            out.append((node, [_usage_row(c, cats[c]) for c in names]))
    return out


def status_of(report: dict) -> dict:
    """A finished rule's status from its report file alone."""
    if report.get("RuleTriggered"):
        details = ""
        if report.get("Finding"):  # what the rule found, kept in its report since it ran
            fix = f" Fix: {report['Recommendation']}" if report.get("Recommendation") else ""
            details = f"{report['Finding']} (triggered {report['RuleTriggered']} time(s)).{fix}"
        return {"RuleEvaluationStatus": "IssuesFound", "StatusDetails": details[:1024]}
    lacking = (report.get("Details") or {}).get("InsufficientData")
    return {"RuleEvaluationStatus": "NoIssuesFound",
            "StatusDetails": f"Insufficient data: {lacking}" if lacking else ""}


def _parameters(text) -> list[tuple[str, str]]:
    """``RuleParameters`` (``name:value`` lines, or a mapping) as pairs."""
    if isinstance(text, dict):
        return [(str(k), str(v)) for k, v in text.items()]
    pairs = [line.partition(":") for line in str(text or "").splitlines() if line.strip()]
    return [(k.strip(), v.strip()) for k, _, v in pairs]


def _rules(reports: dict[str, dict], statuses: dict[str, dict]):
    """The rules table's rows (issues first) and each triggered rule's finding with its
    evidence as tables. A rule without the data to judge keeps the service's status
    (NoIssuesFound) but is marked apart from a clean pass: ``lacking`` says what it missed."""
    rows, findings = [], []
    for name, report in reports.items():
        cls = _CLASSES.get(name)
        status = statuses.get(name, {})
        details = report.get("Details") or {}
        row = {"name": name, "status": status.get("RuleEvaluationStatus", ""),
               "details": status.get("StatusDetails", ""),
               "description": getattr(cls, "description", ""),
               "recommendation": getattr(cls, "recommendation", ""),
               "triggered": report.get("RuleTriggered", 0), "datapoints": report.get("Datapoints", 0),
               "parameters": _parameters(report.get("RuleParameters", "")),
               "lacking": "" if report.get("RuleTriggered") else details.get("InsufficientData", "")}
        rows.append(row)
        if row["triggered"]:
            shown, more = evidence.tables(details)
            findings.append({**row, "finding": report.get("Finding", ""), "evidence": shown,
                             "more": more})
    rows.sort(key=lambda r: (-r["triggered"], bool(r["lacking"]), r["name"]))
    findings.sort(key=lambda f: (-f["triggered"], f["name"]))
    return rows, findings


Series = Mapping[str, Sequence[tuple[float, float]]]  # metric -> (epoch seconds, value)


def _plots(store: Store, reports: dict[str, dict], metrics: Series) -> list[tuple[str, str]]:
    from shoal.profiler.report import plots

    outliers = set()
    for phases in (reports.get("StepOutlier", {}).get("Details") or {}).values():
        if isinstance(phases, dict):
            for phase in phases.values():
                if isinstance(phase, dict):
                    outliers |= set(phase.get("step_numbers", []))
    made = [("Training metrics (the job's metric definitions)",
             plots.training_metrics(metrics, _t0(store, metrics))),
            ("Utilization per host, core and GPU", plots.utilization(store)),
            ("Step durations and outliers", plots.step_durations(store, outliers)),
            ("Load across ranks", plots.load_across_ranks(store)),
            ("Compute and collectives", plots.compute_and_collectives(store)),
            ("Data loading", plots.data_loading(store))]
    return [(title, svg) for title, svg in made if svg]


def _t0(store: Store, metrics: Series) -> float:
    """Where the plots' time axes start: the profiler's first record, else the first metric."""
    span = store.span()
    if span is not None:
        return span[0]
    return min((t for points in metrics.values() for t, _ in points), default=0.0)


def _counts(rows: list[dict]) -> dict[str, int]:
    """How the rules came out, as the page's first line on them says it."""
    return {"issues": sum(1 for r in rows if r["status"] == "IssuesFound"),
            "passed": sum(1 for r in rows if r["status"] == "NoIssuesFound" and not r["lacking"]),
            "lacking": sum(1 for r in rows if r["status"] == "NoIssuesFound" and r["lacking"]),
            "other": sum(1 for r in rows if r["status"] not in ("IssuesFound", "NoIssuesFound"))}


def render(job: str, data_dir: Path, rule_dirs: list[Path], statuses: list[dict] | None = None,
           metrics: Series | None = None) -> str:
    """The page for a job: its profiler data, the rule reports under ``rule_dirs``
    (``<rule-output>/<name>/profiler-output``) and its training metrics, if given."""
    store = Store(Path(data_dir))
    store.load()
    reports: dict[str, dict] = {}
    for folder in rule_dirs:
        for path in sorted((Path(folder) / REPORT_DIR).glob("*.json")):
            reports[path.stem] = json.loads(path.read_text())
    by_rule = {s.get("Rule", s.get("RuleConfigurationName")): s for s in statuses or ()}
    for name, data in reports.items():  # a rule with no status given: its report says it
        by_rule.setdefault(name, status_of(data))
    rows, findings = _rules(reports, by_rule)
    usage = _usage(reports.get("OverallSystemUsage", {}).get("Details") or {})
    phase_totals = (reports.get("OverallFrameworkMetrics", {}).get("Details") or {}).get("phase") or {}
    if not phase_totals:
        for events in store.events.values():
            for e in events:
                phase_totals[e.phase] = phase_totals.get(e.phase, 0.0) + e.duration
    total = sum(phase_totals.values()) or 1.0
    phases = sorted(((k, v, 100 * v / total) for k, v in phase_totals.items()), key=lambda r: -r[1])
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent),
                             undefined=jinja2.StrictUndefined, autoescape=True)
    return env.get_template("template.html.j2").render(
        job=job, generated=_when(datetime.datetime.now(datetime.timezone.utc).timestamp()),
        summary=_summary(store), rules=rows, findings=findings, usage=usage, phases=phases,
        counts=_counts(rows), plots=_plots(store, reports, metrics or {}))


def job_folders(job_dir: Path) -> tuple[Path, list[Path]]:
    """A job's profiler data and its rule-report folders, under ``<job_dir>`` laid out as
    SageMaker lays them out under ``<output>/<job>/`` (``profiler-output``,
    ``rule-output/<rule>/profiler-output``)."""
    job_dir = Path(job_dir)
    return (job_dir / "profiler-output",
            sorted(p for p in (job_dir / "rule-output").glob("*/profiler-output") if p.is_dir()))


def write(path: Path, job: str, data_dir: Path, rule_dirs: list[Path],
          statuses: list[dict] | None = None, metrics: Series | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(job, data_dir, rule_dirs, statuses, metrics), encoding="utf-8")
    return path
