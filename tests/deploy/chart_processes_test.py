"""The chart's containers, run as processes: the coordinator and a worker are started with
exactly the command, args and environment the rendered values-cpu.yaml manifests give
them (ConfigMap variables and $(VAR) expansion as Kubernetes does it), on loopback. Then
the probes the manifests declare are asked as the kubelet would: the coordinator's
startup/liveness/readiness HTTP GETs, the worker's grpc.health.v1 check, the metrics
ports. On SIGTERM both exit within their terminationGracePeriodSeconds.

Two things differ from a cluster, by necessity: the model path is this checkout's model,
and the worker registers with and advertises 127.0.0.1 instead of cluster DNS names."""
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from deploy_support import BUILD_DIR, CHART_DIR, build_renderer, render  # noqa: E402

MODEL_PATH = pathlib.Path(os.environ.get(
    "LOOM_MODEL_PATH",
    pathlib.Path(__file__).resolve().parents[2] / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
BINARIES = {"loom": BUILD_DIR / "coordinator" / "loom",
            "loom-worker": BUILD_DIR / "worker" / "loom-worker"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pod_command(docs, kind, pod_env):
    """(argv, container, pod spec) of the first workload of a kind, args expanded."""
    workload = next(d for d in docs if d["kind"] == kind)
    pod = workload["spec"]["template"]["spec"]
    c = pod["containers"][0]
    env = {}
    for source in c.get("envFrom", []):
        name = source["configMapRef"]["name"]
        env.update(next(d for d in docs if d["kind"] == "ConfigMap"
                        and d["metadata"]["name"] == name)["data"])
    for var in c.get("env", []):
        env[var["name"]] = var.get("value", pod_env.get(var["name"]))
    env["LOOM_MODEL_PATH"] = str(MODEL_PATH)
    expand = lambda s: re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], s)  # noqa: E731
    binary = BINARIES[c["command"][0]]
    return [str(binary)] + [expand(a) for a in c["args"]], c, pod


def replace_value(argv, flag, value):
    argv[argv.index(flag) + 1] = value


def http_status(url) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
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


@pytest.fixture
def cluster(tmp_path):
    for binary in BINARIES.values():
        if not binary.exists():
            pytest.skip(f"{binary} is not built")
    if not MODEL_PATH.exists():
        pytest.fail(f"default model missing at {MODEL_PATH}: run scripts/fetch-model.sh")
    ports = {name: free_port() for name in ("grpc", "http", "worker", "metrics")}
    values = {"coordinator": {"grpcPort": ports["grpc"], "httpPort": ports["http"],
                              "drainTimeoutSeconds": 5},
              "worker": {"replicas": 1, "port": ports["worker"],
                         "metrics": {"enabled": True, "port": ports["metrics"]},
                         "flags": {"threads": 1, "kv-cache-memory": "64MiB"}}}
    code, docs, stderr = render(build_renderer(), values, [CHART_DIR / "values-cpu.yaml"], tmp_path)
    assert code == 0, stderr
    pod_env = {"POD_NAME": "loom-worker-r0-0", "POD_NAMESPACE": "serving", "LOOM_RANK": "0"}
    coordinator_argv, coordinator, coordinator_pod = pod_command(docs, "Deployment", pod_env)
    worker_argv, worker, worker_pod = pod_command(docs, "StatefulSet", pod_env)
    assert worker_argv[worker_argv.index("--rank") + 1] == "0"
    replace_value(worker_argv, "--coordinator", f"127.0.0.1:{ports['grpc']}")
    replace_value(worker_argv, "--advertise-address", f"127.0.0.1:{ports['worker']}")
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("coordinator", "worker")}
    processes = [
        subprocess.Popen(coordinator_argv, stdout=logs["coordinator"], stderr=subprocess.STDOUT),
        subprocess.Popen(worker_argv, stdout=logs["worker"], stderr=subprocess.STDOUT)]
    try:
        yield {"ports": ports, "processes": processes, "coordinator": coordinator,
               "worker": worker, "coordinator_pod": coordinator_pod, "worker_pod": worker_pod}
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
            p.wait()
        for log in logs.values():
            log.close()
        for name in logs:
            print(f"--- {name} log:\n{(tmp_path / f'{name}.log').read_text()[-3000:]}")


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
    with grpc.insecure_channel(f"127.0.0.1:{ports['worker']}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING

    # The scrape targets the ServiceMonitor names.
    with urllib.request.urlopen(f"{http}/metrics", timeout=5) as response:
        assert "loom_replica_up" in response.read().decode()
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics']}/metrics", timeout=5) as response:
        assert 'loom_worker_up{' in response.read().decode()


def test_sigterm_ends_both_within_their_grace_period(cluster):
    ports, processes = cluster["ports"], cluster["processes"]
    http = f"http://127.0.0.1:{ports['http']}"
    wait_for(lambda: http_status(http + "/ready") == 200, 60, "coordinator /ready", processes)
    coordinator_process, worker_process = processes
    for process, pod in [(coordinator_process, cluster["coordinator_pod"]),
                         (worker_process, cluster["worker_pod"])]:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=pod["terminationGracePeriodSeconds"])
        except subprocess.TimeoutExpired:
            pytest.fail(f"{process.args[0]} outlived terminationGracePeriodSeconds="
                        f"{pod['terminationGracePeriodSeconds']} after SIGTERM")
