"""The chart's PrometheusRule: its rules pass `promtool check rules`, and `promtool test rules`
feeds each alert series that must fire it and series that must not (Debian's
`prometheus` package, installed by scripts/install-deps.sh). The series names are checked
against what Loom exports, so a renamed metric cannot leave an alert that never fires."""
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from deploy_support import build_renderer, exported_metrics, render  # noqa: E402

NS = "serving"
COORDINATOR = {"namespace": NS, "service": "loom-coordinator"}
VALUES = {"prometheusRule": {"enabled": True, "ttftP90SloSeconds": 2, "kvCacheUsageThreshold": 0.95,
                             "queueThreshold": 16, "for": "10m"}}
ALERTS = ["LoomNoHealthyReplica", "LoomQueueGrowing", "LoomKvCacheNearlyFull",
          "LoomTimeToFirstTokenSlo", "LoomWorkerRestarts"]


def series(name, values, **labels):
    labels = {**COORDINATOR, **labels} if not name.startswith("kube_") else labels
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def alert(name, time, fired, labels=None):
    """An alert_rule_test: `fired` is a list of label sets (empty: must not fire)."""
    return {"eval_time": time, "alertname": name,
            "exp_alerts": [{"exp_labels": l} for l in fired]}


# One case per (alert, fires or not): the series, then what is expected when.
CASES = {
    "no replica ever registered": (
        [], [alert("LoomNoHealthyReplica", "3m", [{"severity": "critical"}])]),
    "every replica went down": (
        [series("loom_replica_up", "1x9 0x20", replica="loom-worker-0")],
        [alert("LoomNoHealthyReplica", "9m", []),
         alert("LoomNoHealthyReplica", "10m", []),  # `for: 2m` not yet over
         alert("LoomNoHealthyReplica", "13m", [{"severity": "critical"}])]),
    "one replica of two is up": (
        [series("loom_replica_up", "1x30", replica="loom-worker-0"),
         series("loom_replica_up", "0x30", replica="loom-worker-1")],
        [alert("LoomNoHealthyReplica", "20m", [])]),
    "queue keeps growing": (
        [series("loom_num_requests_waiting", "0+1x60", replica="loom-worker-0")],
        [alert("LoomQueueGrowing", "20m", []),  # over 16 only since 17m
         alert("LoomQueueGrowing", "35m", [{"severity": "warning"}])]),
    "queue long but steady": (
        [series("loom_num_requests_waiting", "40x60", replica="loom-worker-0")],
        [alert("LoomQueueGrowing", "45m", [])]),
    "queue growing but short": (
        [series("loom_num_requests_waiting", "0+0.2x60", replica="loom-worker-0")],
        [alert("LoomQueueGrowing", "45m", [])]),
    "one replica's KV cache nearly full": (
        [series("loom_kv_cache_usage_perc", "0.99x30", replica="loom-worker-0"),
         series("loom_kv_cache_usage_perc", "0.5x30", replica="loom-worker-1")],
        [alert("LoomKvCacheNearlyFull", "5m", []),
         alert("LoomKvCacheNearlyFull", "15m", [{"severity": "warning", "replica": "loom-worker-0"}])]),
    "slow first tokens": (
        [series("loom_time_to_first_token_seconds_bucket", "0+1x40", le="1.0"),
         series("loom_time_to_first_token_seconds_bucket", "0+1x40", le="2.5"),
         series("loom_time_to_first_token_seconds_bucket", "0+10x40", le="5.0"),
         series("loom_time_to_first_token_seconds_bucket", "0+10x40", le="+Inf")],
        [alert("LoomTimeToFirstTokenSlo", "8m", []),
         alert("LoomTimeToFirstTokenSlo", "20m", [{"severity": "warning"}])]),
    "fast first tokens": (
        [series("loom_time_to_first_token_seconds_bucket", "0+10x40", le="1.0"),
         series("loom_time_to_first_token_seconds_bucket", "0+10x40", le="2.5"),
         series("loom_time_to_first_token_seconds_bucket", "0+10x40", le="5.0"),
         series("loom_time_to_first_token_seconds_bucket", "0+10x40", le="+Inf")],
        [alert("LoomTimeToFirstTokenSlo", "30m", [])]),
    "a worker restarted": (
        [series("kube_pod_container_status_restarts_total", "0x10 1x20",
                namespace=NS, pod="loom-worker-1", container="worker"),
         series("kube_pod_container_status_restarts_total", "0x30",
                namespace=NS, pod="loom-worker-0", container="worker"),
         # Another release's and another container's restarts are not ours.
         series("kube_pod_container_status_restarts_total", "0x10 3x20",
                namespace=NS, pod="other-worker-0", container="worker"),
         series("kube_pod_container_status_restarts_total", "0x10 3x20",
                namespace=NS, pod="loom-worker-0", container="fetch-model")],
        [alert("LoomWorkerRestarts", "5m", []),
         alert("LoomWorkerRestarts", "12m", [{"severity": "warning", "namespace": NS,
                                              "pod": "loom-worker-1", "container": "worker"}]),
         alert("LoomWorkerRestarts", "29m", [])]),  # 15 minutes without a restart
}


@pytest.fixture(scope="module")
def promtool():
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: run scripts/install-deps.sh (Debian package prometheus)")
    return path


@pytest.fixture(scope="module")
def rule_file(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rules")
    code, docs, stderr = render(build_renderer(), VALUES, tmp_path=tmp, namespace=NS)
    assert code == 0, stderr
    [rule] = [d for d in docs if d["kind"] == "PrometheusRule"]
    path = tmp / "loom-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


@pytest.fixture(scope="module")
def rules_without_annotations(rule_file):
    """The rules as rendered, less their annotations: the unit tests below compare labels
    (when and for what an alert fires); `promtool check rules` checks the annotation
    templates."""
    groups = yaml.safe_load(rule_file.read_text())["groups"]
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    path = rule_file.with_name("loom-rules-labels-only.yaml")
    path.write_text(yaml.safe_dump({"groups": groups}))
    return path


def run_promtool(promtool, *args):
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120)


def test_rules_pass_promtool_check(promtool, rule_file):
    result = run_promtool(promtool, "check", "rules", str(rule_file))
    assert result.returncode == 0, result.stdout + result.stderr
    names = [r["alert"] for g in yaml.safe_load(rule_file.read_text())["groups"] for r in g["rules"]]
    assert names == ALERTS


def test_every_alert_has_cases_that_fire_and_do_not_fire():
    fires = {a: False for a in ALERTS}
    silent = {a: False for a in ALERTS}
    for _, checks in CASES.values():
        for check in checks:
            (fires if check["exp_alerts"] else silent)[check["alertname"]] = True
    assert all(fires.values()) and all(silent.values()), (fires, silent)


def test_rules_name_series_loom_exports(rule_file):
    exported = exported_metrics()
    used = set()
    for group in yaml.safe_load(rule_file.read_text())["groups"]:
        for rule in group["rules"]:
            used |= set(re.findall(r"\b(loom_[a-z_]+)\{", rule["expr"]))
    assert used and used <= set(exported), used - set(exported)


@pytest.mark.parametrize("case", CASES)
def test_alert_fires_exactly_when_it_should(promtool, rules_without_annotations, tmp_path, case):
    input_series, checks = CASES[case]
    tests = {"rule_files": [str(rules_without_annotations)], "evaluation_interval": "1m",
             "tests": [{"interval": "1m", "input_series": input_series, "alert_rule_test": checks}]}
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(tests))
    result = run_promtool(promtool, "test", "rules", str(path))
    assert result.returncode == 0, f"{case}:\n{result.stdout}{result.stderr}"


def test_promtool_test_catches_a_wrong_expectation(promtool, rules_without_annotations, tmp_path):
    """The harness can fail: the KV alert expected on the wrong replica is an error."""
    input_series, _ = CASES["one replica's KV cache nearly full"]
    wrong = [alert("LoomKvCacheNearlyFull", "15m", [{"severity": "warning", "replica": "loom-worker-1"}])]
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [str(rules_without_annotations)], "evaluation_interval": "1m",
                                    "tests": [{"interval": "1m", "input_series": input_series,
                                               "alert_rule_test": wrong}]}))
    assert run_promtool(promtool, "test", "rules", str(path)).returncode != 0
