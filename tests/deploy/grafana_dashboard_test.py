"""The Grafana dashboard (deploy/grafana/loom.json) queries only metrics Loom exports.

Exported names are read from the sources that register them (coordinator/metrics.cc and
worker/worker_metrics.cc: every `.Name("...")` of a BuildCounter/BuildGauge/BuildHistogram
chain); a histogram exports NAME_bucket, NAME_sum and NAME_count, not NAME. Every PromQL
expression of the dashboard (panel targets and template-variable queries) is parsed for
the metric names it selects, and each must be exported."""
import copy
import json
import pathlib
import re
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from deploy_support import METRIC_SOURCES, SOURCE_DIR, exported_metrics  # noqa: E402

DASHBOARD = SOURCE_DIR / "deploy" / "grafana" / "loom.json"

# PromQL words that look like identifiers but are not metric names.
PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "and", "or", "unless", "atan2", "inf", "nan",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    names = set()
    # Grafana's variable queries: label_values(SELECTOR, LABEL) or label_values(LABEL).
    for match in re.finditer(r"label_values\(([^()]*)\)", expr):
        if "," in match.group(1):
            names |= metric_names(match.group(1).rsplit(",", 1)[0])
    expr = re.sub(r"label_values\(([^()]*)\)", " ", expr)
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # range and subquery durations
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\$\{?\w+\}?", " ", expr)  # Grafana variables
    expr = re.sub(r"\b\d+(\.\d+)?([eE][-+]?\d+)?[smhdwy]?\b", " ", expr)  # numbers, durations
    for match in re.finditer(r"([a-zA-Z_:][\w:]*)\s*(\()?", expr):
        word, call = match.group(1), match.group(2)
        if call or word in PROMQL_KEYWORDS:
            continue
        names.add(word)
    return names


def dashboard_expressions(dashboard) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target, nested rows included, and variable query."""
    found = []

    def walk_panels(panels):
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((panel.get("title", "?"), target["expr"]))
            walk_panels(panel.get("panels", []))

    walk_panels(dashboard.get("panels", []))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        if query:
            found.append((f"${variable['name']}", query))
    return found


def unknown_metrics(dashboard, exported) -> list[str]:
    return [f"{where}: {name}" for where, expr in dashboard_expressions(dashboard)
            for name in sorted(metric_names(expr)) if name not in exported]


@pytest.fixture(scope="module")
def dashboard():
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def exported():
    metrics = exported_metrics()
    # The parser must see the registrations: a few names the dashboard relies on.
    for name in ("loom_num_requests_running", "loom_request_success_total",
                 "loom_time_to_first_token_seconds_bucket", "loom_kv_cache_usage_perc"):
        assert name in metrics, f"{name} not found in {METRIC_SOURCES[0]}"
    return metrics


def test_every_expression_uses_only_exported_metrics(dashboard, exported):
    expressions = dashboard_expressions(dashboard)
    assert len(expressions) > 30
    assert not unknown_metrics(dashboard, exported), unknown_metrics(dashboard, exported)


def test_check_fails_for_an_unknown_or_misused_metric(dashboard, exported):
    # A made-up name, a counter without its _total, and a histogram's bare name.
    assert metric_names('sum(rate(loom_no_such_metric_total{model_name=~"$model"}[5m]))') == {
        "loom_no_such_metric_total"}
    for bad in ("loom_no_such_metric_total", "loom_num_preemptions",
                "loom_time_to_first_token_seconds"):
        assert bad not in exported
    broken = copy.deepcopy(dashboard)
    broken["panels"][-1]["targets"][0]["expr"] = "rate(loom_no_such_metric_total[5m])"
    assert unknown_metrics(broken, exported) == [
        f"{broken['panels'][-1]['title']}: loom_no_such_metric_total"]
    broken = copy.deepcopy(dashboard)
    broken["templating"]["list"][1]["query"]["query"] = "label_values(loom_nope, model_name)"
    assert unknown_metrics(broken, exported) == ["$model: loom_nope"]


def test_parser_ignores_functions_labels_and_keywords():
    expr = ('histogram_quantile(0.99, sum by (le, replica) (rate(loom_a_bucket{replica=~"$replica", '
            'le!="+Inf"}[$__rate_interval]))) / on (replica) group_left sum without (rank) '
            '(loom_b offset 5m) > bool 0 or vector(0) and loom_c_total[5m:1m]')
    assert metric_names(expr) == {"loom_a_bucket", "loom_b", "loom_c_total"}


def test_overview_panels_and_model_variable(dashboard):
    titles = " | ".join(p["title"].lower() for p in dashboard["panels"])
    for wanted in ("request rate", "tokens/s", "time to first token", "inter-token latency",
                   "end-to-end", "queue depth", "running / waiting", "kv cache usage",
                   "prefix cache hit rate", "preemptions", "speculative", "per replica",
                   "per worker"):
        assert wanted in titles, f"no panel about {wanted}"
    exprs = [e for _, e in dashboard_expressions(dashboard)]
    for histogram in ("loom_time_to_first_token_seconds", "loom_inter_token_latency_seconds",
                      "loom_e2e_request_latency_seconds"):
        assert any(f"histogram_quantile(0.99, sum by (le) (rate({histogram}_bucket" in e
                   for e in exprs), f"no p99 of {histogram}"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert "model_name" in variables["model"]["query"]["query"]
    # Every variable an expression uses is defined (Grafana's own $__ variables aside).
    used = {v for _, e in dashboard_expressions(dashboard) for v in re.findall(r"\$(\w+)", e)}
    assert {v for v in used if not v.startswith("__")} <= set(variables)
    # Panels carry unique ids and sit on the 24-column grid.
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in dashboard["panels"])
