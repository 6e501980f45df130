"""Evaluating a job's profiler rules, as Debugger's rule jobs do: each configured rule (or
every rule, for ``ProfilerReport``) scans the job's data in windows of its
``scan_interval_us``, during the job (``Evaluation.advance``) and over all of it at the end
(``advance(final=True)``), and writes ``profiler-reports/<Rule>.json`` after every window.

    python -m shoal.profiler.engine --data DIR --out DIR --rule NAME k=v ...

The statuses follow the API's ``RuleEvaluationStatus``: ``InProgress`` until the data ends,
then ``IssuesFound`` or ``NoIssuesFound``; a rule that fails is ``Error`` with its reason.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from shoal.profiler import rule_table
from shoal.profiler.data import Store
from shoal.profiler.rules import RULES, SHOAL_RULES, Rule

REPORT_DIR = "profiler-reports"


def rules_for(rule_to_invoke: str, parameters: dict[str, Any]) -> list[Rule]:
    """The rules a configuration runs: one, or for ProfilerReport every rule, each with the
    ``<Rule>_<parameter>`` values meant for it."""
    if rule_to_invoke == rule_table.SHOAL_CONFIGURATION:
        scan = {k: v for k, v in parameters.items() if k == "scan_interval_us"}
        return [cls(scan) for cls in SHOAL_RULES.values()]
    if rule_to_invoke in SHOAL_RULES:
        return [SHOAL_RULES[rule_to_invoke](parameters)]
    if rule_to_invoke != rule_table.REPORT:
        return [RULES[rule_to_invoke](parameters)]
    per_rule: dict[str, dict[str, Any]] = {}
    for key, value in parameters.items():
        if key in ("rule_to_invoke", "opt_out_telemetry", "scan_interval_us"):
            continue
        rule, param = rule_table.report_key(key)
        per_rule.setdefault(rule, {})[param] = value
    scan = {"scan_interval_us": parameters["scan_interval_us"]} if "scan_interval_us" in parameters else {}
    return [cls({**scan, **per_rule.get(name, {})}) for name, cls in RULES.items()]


class _Cursor:
    """How far a rule has read: the end of its last window."""

    def __init__(self, rule: Rule):
        self.rule = rule
        self.until: float | None = None
        self.error: str | None = None


class Evaluation:
    """The rules of one configuration over one job's data."""

    def __init__(self, data_dir: Path, rules: list[Rule], out_dir: Path):
        self.store = Store(data_dir)
        self.cursors = [_Cursor(r) for r in rules]
        self.out_dir = Path(out_dir)
        self.done = False

    def advance(self, final: bool = False) -> None:
        """Feed every rule the windows the data now covers (all of it when ``final``)."""
        self.store.load()
        span = self.store.span()
        if span is not None:
            for cursor in self.cursors:
                self._feed(cursor, span, final)
        if final:
            for cursor in self.cursors:
                if cursor.error is None:
                    cursor.rule.finish()
            self.done = True
        self.write()

    def _feed(self, cursor: _Cursor, span, final: bool) -> None:
        width = cursor.rule.params["scan_interval_us"] / 1e6
        start = span[0] if cursor.until is None else cursor.until
        while cursor.error is None and (start + width <= span[1] or (final and start <= span[1])):
            end = start + width
            metrics, events = self.store.window(start, end)
            try:
                cursor.rule.scan(metrics, events)
            except Exception as error:  # a rule's own failure is its status, not the job's
                cursor.error = f"{type(error).__name__}: {error}"
            start = cursor.until = end

    def statuses(self) -> list[dict[str, str]]:
        out = []
        for cursor in self.cursors:
            rule = cursor.rule
            if cursor.error:
                status, details = "Error", cursor.error
            elif not self.done:
                status, details = "InProgress", ""
            else:
                status, details = rule.status, rule.status_details
            out.append({"Rule": rule.name, "RuleEvaluationStatus": status, "StatusDetails": details})
        return out

    def write(self) -> None:
        folder = self.out_dir / REPORT_DIR
        folder.mkdir(parents=True, exist_ok=True)
        for cursor in self.cursors:
            path = folder / f"{cursor.rule.name}.json"
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(cursor.rule.result(), indent=1, default=float))
            tmp.replace(path)  # readers never see half a report


def findings_text(lines: list[str], limit: int = 1024) -> str:
    """One ``<Rule>: <finding> (triggered N time(s)). Fix: <text>`` line per rule that found
    an issue, within the API's ``limit`` on StatusDetails: when they do not fit, the fixes
    go first (every built-in rule's fix is also in its report), then the tail."""
    text = "\n".join(lines)
    if len(text) > limit:
        text = "\n".join(line.split(" Fix: ", 1)[0] for line in lines)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def overall_status(evaluation: Evaluation) -> tuple[str, str]:
    """One configuration's status: IssuesFound if any of its rules found one."""
    statuses = evaluation.statuses()
    if any(s["RuleEvaluationStatus"] == "InProgress" for s in statuses):
        return "InProgress", ""
    found = [s for s in statuses if s["RuleEvaluationStatus"] == "IssuesFound"]
    if found:
        return "IssuesFound", findings_text([f"{s['Rule']}: {s['StatusDetails']}" for s in found])
    errors = [s for s in statuses if s["RuleEvaluationStatus"] == "Error"]
    if errors and len(errors) == len(statuses):
        return "Error", "; ".join(s["StatusDetails"] for s in errors)[:1024]
    lacking = [s["Rule"] for s in statuses if s["StatusDetails"].startswith("Insufficient")]
    note = f"insufficient data for {', '.join(lacking)}" if lacking else ""
    return "NoIssuesFound", note[:1024]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="the job's profiler output")
    parser.add_argument("--out", required=True, help="where profiler-reports/ goes")
    parser.add_argument("--rule", default=rule_table.REPORT)
    parser.add_argument("params", nargs="*", help="key=value rule parameters")
    args = parser.parse_args(argv)
    params = dict(p.split("=", 1) for p in args.params)
    evaluation = Evaluation(Path(args.data), rules_for(args.rule, params), Path(args.out))
    evaluation.advance(final=True)
    status, details = overall_status(evaluation)
    print(json.dumps({"RuleEvaluationStatus": status, "StatusDetails": details,
                      "Rules": evaluation.statuses()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
