"""The chart's containers, run as processes: the coordinator and a worker pod's container
are started with exactly the command, args and environment the rendered manifests give
them (ConfigMap variables and $(VAR) expansion as Kubernetes does it), on loopback: the
worker container's launcher (bash) starts the pod's tensor-parallel ranks. Then the
probes the manifests declare are asked as the kubelet would: the coordinator's
startup/liveness/readiness HTTP GETs, the worker's grpc.health.v1 check, the metrics
ports. On SIGTERM both exit within their terminationGracePeriodSeconds.

Three configurations: values-cpu.yaml (one rank per pod), the GPU values file
(values.yaml) with tensorParallelSize 2, run here with the CPU backend: one pod, two
rank processes that meet through the coordinator and serve as one replica, and
values-cpu.yaml serving a Hugging Face model directory from a PVC (model.format
huggingFace, model.file "."; the directory is written from the default model by
tests/common/hf_checkpoint.py).

What differs from a cluster, by necessity: the model path is this checkout's model, the
worker registers with and advertises 127.0.0.1 instead of cluster DNS names, and the GPU
file's backend is the CPU one."""
import json
import os
import pathlib
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

# Outcomes that rest on time: scripts/test-slow-machine.sh runs them again on one core.
pytestmark = pytest.mark.slow_machine

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from deploy_support import BUILD_DIR, CHART_DIR, build_renderer, render, require_binaries  # noqa: E402

MODEL_PATH = pathlib.Path(os.environ.get(
    "LOOM_MODEL_PATH",
    pathlib.Path(__file__).resolve().parents[2] / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
BINARIES = {"loom": BUILD_DIR / "coordinator" / "loom",
            "loom-worker": BUILD_DIR / "worker" / "loom-worker"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(count: int) -> int:
    """The first of `count` consecutive free ports (a pod's ranks use port + rank)."""
    for _ in range(100):
        base = free_port()
        sockets = []
        try:
            for i in range(count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    pytest.fail(f"no {count} consecutive free ports")


def pod_command(docs, kinds, pod_env, env_overrides=None, model_path=MODEL_PATH):
    """(argv, environment, container, pod spec) of the first workload of one of `kinds`,
    with Kubernetes' $(VAR) expansion; the binaries' names point into the build tree."""
    workload = next(d for d in docs if d["kind"] in kinds)
    pod = workload["spec"]["template"]["spec"]
    c = pod["containers"][0]
    env = {}
    expand = lambda s: re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], s)  # noqa: E731
    for source in c.get("envFrom", []):
        name = source["configMapRef"]["name"]
        env.update(next(d for d in docs if d["kind"] == "ConfigMap"
                        and d["metadata"]["name"] == name)["data"])
    for var in c.get("env", []):
        env[var["name"]] = expand(var["value"]) if "value" in var else pod_env[var["name"]]
    env["LOOM_MODEL_PATH"] = str(model_path)
    env.update(env_overrides or {})
    argv = [str(BINARIES[a]) if a in BINARIES else a
            for a in c["command"] + [expand(arg) for arg in c["args"]]]
    return argv, dict(os.environ, **env), c, pod


def mount_secrets(argv, container_spec, pod, secrets, directory):
    """Kubernetes' Secret volumes, here: each mounted Secret's files (`secrets`: name ->
    {key: text}) written under `directory`, and argv's paths into the mount rewritten."""
    for mount in container_spec.get("volumeMounts", []):
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        if "secret" not in volume:
            continue
        files = secrets[volume["secret"]["secretName"]]
        local = directory / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        for key, text in files.items():
            (local / key).write_text(text)
        prefix = mount["mountPath"].rstrip("/") + "/"
        argv[:] = [str(local) + "/" + a[len(prefix):] if a.startswith(prefix) else a for a in argv]


def replace_value(argv, flag, value):
    argv[argv.index(flag) + 1] = value


def http_status(url, context=None) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def wait_for(predicate, timeout, what, processes):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        for p in processes:
            assert p.poll() is None, f"{p.args[0]} exited with {p.returncode}: {what}"
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def start_pods(tmp_path, values_files, worker_values, ranks, model_values=None,
               model_path=MODEL_PATH, rendered_model_path=None, extra_values=None, secrets=None):
    """Renders the chart and starts the coordinator and one worker pod's container; yields
    what the tests need, then kills whatever is left. `model_path` replaces the rendered
    LOOM_MODEL_PATH (checked against `rendered_model_path` when given). `extra_values` are
    more chart values; `secrets` the Secrets the cluster would hold (name -> {key: text}),
    including those the chart renders itself."""
    missing = require_binaries(*BINARIES.values())  # unbuilt binaries fail, never skip
    if missing:
        pytest.fail(missing)
    if not MODEL_PATH.exists():
        pytest.fail(f"default model missing at {MODEL_PATH}: run scripts/fetch-model.sh")
    ports = {"grpc": free_port(), "http": free_port(), "worker": free_ports(ranks),
             "metrics": free_ports(ranks)}
    worker_values = {"port": ports["worker"], "metrics": {"enabled": True, "port": ports["metrics"]},
                     **worker_values}
    values = {"coordinator": {"grpcPort": ports["grpc"], "httpPort": ports["http"],
                              "drainTimeoutSeconds": 5},
              "worker": worker_values}
    if model_values:
        values["model"] = model_values
    values.update(extra_values or {})
    code, docs, stderr = render(build_renderer(), values, [CHART_DIR / f for f in values_files], tmp_path)
    assert code == 0, stderr
    secrets = dict(secrets or {})
    for secret in (d for d in docs if d["kind"] == "Secret"):
        secrets[secret["metadata"]["name"]] = secret["stringData"]
    if rendered_model_path is not None:
        paths = {d["data"]["LOOM_MODEL_PATH"] for d in docs
                 if d["kind"] == "ConfigMap" and "LOOM_MODEL_PATH" in d.get("data", {})}
        assert paths == {rendered_model_path}, paths
    pod_env = {"POD_NAME": "loom-worker-0", "POD_NAMESPACE": "serving"}
    coordinator_argv, coordinator_env, coordinator, coordinator_pod = pod_command(
        docs, ("Deployment",), pod_env, model_path=model_path)
    worker_argv, worker_env, worker, worker_pod = pod_command(
        docs, ("StatefulSet",), pod_env, {"LOOM_ADVERTISE_HOST": "127.0.0.1"},
        model_path=model_path)
    mount_secrets(coordinator_argv, coordinator, coordinator_pod, secrets, tmp_path / "secrets")
    mount_secrets(worker_argv, worker, worker_pod, secrets, tmp_path / "secrets")
    assert worker_argv[:2] == ["/bin/bash", "-c"] and worker_env["LOOM_RANKS_PER_POD"] == str(ranks)
    coordinator_flag = worker_argv.index("--coordinator") + 1
    worker_argv[coordinator_flag] = f"127.0.0.1:{ports['grpc']}"
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("coordinator", "worker")}
    processes = [
        subprocess.Popen(coordinator_argv, env=coordinator_env, stdout=logs["coordinator"],
                         stderr=subprocess.STDOUT),
        subprocess.Popen(worker_argv, env=worker_env, stdout=logs["worker"], stderr=subprocess.STDOUT,
                         start_new_session=True)]
    try:
        yield {"ports": ports, "processes": processes, "coordinator": coordinator,
               "worker": worker, "coordinator_pod": coordinator_pod, "worker_pod": worker_pod,
               "ranks": ranks, "log": tmp_path / "worker.log"}
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
            p.wait()
        # The launcher's rank processes, should the launcher have been killed.
        try:
            os.killpg(processes[1].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for log in logs.values():
            log.close()
        for name in logs:
            print(f"--- {name} log:\n{(tmp_path / f'{name}.log').read_text()[-3000:]}")


@pytest.fixture(scope="module")
def hf_model_dir(tmp_path_factory):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "common"))
    import hf_checkpoint
    if not MODEL_PATH.exists():
        pytest.fail(f"default model missing at {MODEL_PATH}: run scripts/fetch-model.sh")
    return hf_checkpoint.write_hf_directory(MODEL_PATH, tmp_path_factory.mktemp("hf") / "smollm2",
                                            dtype="bfloat16")


@pytest.fixture(params=["cpu", "gpu-tp2", "hf-directory"])
def cluster(request, tmp_path):
    if request.param == "hf-directory":
        yield from start_pods(
            tmp_path, ["values-cpu.yaml"],
            {"replicas": 1, "flags": {"threads": 1, "kv-cache-memory": "64MiB"}}, 1,
            model_values={"source": "pvc", "format": "huggingFace", "file": ".",
                          "pvc": {"claimName": "smollm2"}},
            model_path=request.getfixturevalue("hf_model_dir"), rendered_model_path="/models")
    elif request.param == "cpu":
        yield from start_pods(tmp_path, ["values-cpu.yaml"],
                              {"replicas": 1, "flags": {"threads": 1, "kv-cache-memory": "64MiB"}}, 1)
    else:
        # The GPU values file as it is, but for the backend: two ranks in one pod.
        yield from start_pods(tmp_path, [], {"tensorParallelSize": 2, "flags": {
            "backend": "cpu", "device": "cpu", "threads": 1, "kv-cache-memory": "64MiB"}}, 2)


def test_containers_start_with_the_chart_args_and_pass_their_probes(cluster):
    ports, processes = cluster["ports"], cluster["processes"]
    coordinator, worker = cluster["coordinator"], cluster["worker"]
    http = f"http://127.0.0.1:{ports['http']}"
    startup = coordinator["startupProbe"]["httpGet"]["path"]
    wait_for(lambda: http_status(http + startup) == 200, 30, f"coordinator {startup}", processes)
    assert http_status(http + coordinator["livenessProbe"]["httpGet"]["path"]) == 200
    readiness = coordinator["readinessProbe"]["httpGet"]["path"]
    wait_for(lambda: http_status(http + readiness) == 200, 60,
             f"coordinator {readiness} (a worker registered)", processes)

    # The kubelet's gRPC probe: grpc.health.v1 Check with an empty service name.
    assert worker["readinessProbe"]["grpc"]["port"] == ports["worker"]
    wait_for(lambda: http_status(http + readiness) == 200, 60, "the replica", processes)
    with grpc.insecure_channel(f"127.0.0.1:{ports['worker']}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING

    # The scrape targets the ServiceMonitor names: the coordinator, and every rank.
    with urllib.request.urlopen(f"{http}/metrics", timeout=5) as response:
        text = response.read().decode()
    # One replica, named after the pod, with all its ranks.
    assert re.search(r'loom_replica_up\{[^}]*replica="loom-worker-0"[^}]*\} 1', text), text[-2000:]
    for rank in range(cluster["ranks"]):
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics'] + rank}/metrics",
                                    timeout=5) as response:
            body = response.read().decode()
        assert re.search(rf'loom_worker_up\{{[^}}]*rank="{rank}"', body), body[:1000]
    # The pod serves: a completion over the OpenAI API.
    request = urllib.request.Request(
        f"{http}/v1/completions", method="POST", headers={"Content-Type": "application/json"},
        data=json.dumps({"model": json.loads(urllib.request.urlopen(f"{http}/v1/models").read())
                         ["data"][0]["id"], "prompt": "Hello", "max_tokens": 4}).encode())
    with urllib.request.urlopen(request, timeout=120) as response:
        assert json.loads(response.read())["usage"]["completion_tokens"] == 4


def test_sigterm_ends_both_within_their_grace_period(cluster):
    ports, processes = cluster["ports"], cluster["processes"]
    http = f"http://127.0.0.1:{ports['http']}"
    wait_for(lambda: http_status(http + "/ready") == 200, 60, "coordinator /ready", processes)
    coordinator_process, worker_process = processes
    for process, pod in [(coordinator_process, cluster["coordinator_pod"]),
                         (worker_process, cluster["worker_pod"])]:
        process.send_signal(signal.SIGTERM)
        try:
            assert process.wait(timeout=pod["terminationGracePeriodSeconds"]) == 0, \
                f"{process.args[0]} exited with {process.returncode} after SIGTERM"
        except subprocess.TimeoutExpired:
            pytest.fail(f"{process.args[0]} outlived terminationGracePeriodSeconds="
                        f"{pod['terminationGracePeriodSeconds']} after SIGTERM")
    # No rank outlives the worker container's launcher.
    with pytest.raises(ProcessLookupError):
        os.killpg(worker_process.pid, 0)
    assert cluster["log"].read_text().count("loom-worker: stopped after") == cluster["ranks"]


@pytest.fixture
def secured_cluster(tmp_path):
    """values-cpu.yaml with an API key (the chart writes its Secret) and HTTPS from a TLS
    Secret holding a self-signed certificate."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "http"))
    from api_keys_test import make_certificate
    cert, key = make_certificate(tmp_path)
    yield from start_pods(
        tmp_path, ["values-cpu.yaml"],
        {"replicas": 1, "flags": {"threads": 1, "kv-cache-memory": "64MiB"}}, 1,
        extra_values={"apiKey": {"value": "sk-chart"}, "tls": {"existingSecret": "loom-tls"}},
        secrets={"loom-tls": {"tls.crt": cert.read_text(), "tls.key": key.read_text()}})


def test_with_keys_and_tls_the_kubelets_probes_pass_and_clients_need_the_key(secured_cluster):
    ports, processes = secured_cluster["ports"], secured_cluster["processes"]
    coordinator = secured_cluster["coordinator"]
    https = f"https://127.0.0.1:{ports['http']}"
    # The kubelet does not verify the certificate and sends no key.
    kubelet = ssl.create_default_context()
    kubelet.check_hostname = False
    kubelet.verify_mode = ssl.CERT_NONE
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert coordinator[probe]["httpGet"]["scheme"] == "HTTPS"
    startup = coordinator["startupProbe"]["httpGet"]["path"]
    wait_for(lambda: http_status(https + startup, kubelet) == 200, 30, f"coordinator {startup}",
             processes)
    assert http_status(https + coordinator["livenessProbe"]["httpGet"]["path"], kubelet) == 200
    readiness = coordinator["readinessProbe"]["httpGet"]["path"]
    wait_for(lambda: http_status(https + readiness, kubelet) == 200, 60,
             f"coordinator {readiness} (a worker registered)", processes)
    assert http_status(https + "/metrics", kubelet) == 200  # the ServiceMonitor's scrape
    assert http_status(https + "/v1/models", kubelet) == 401  # clients need the key
    request = urllib.request.Request(f"{https}/v1/models",
                                     headers={"Authorization": "Bearer sk-chart"})
    with urllib.request.urlopen(request, timeout=10, context=kubelet) as response:
        assert json.loads(response.read())["data"]
