"""The cluster secret (common/cluster_secret.h) between real processes: a coordinator and a
worker given the same --cluster-secret-file serve; a worker without it, or with another, is
refused at registration and exits with the reason; a stranger calling the coordinator's
internal service (Register, the rendezvous store) or the worker's (Step) directly is
UNAUTHENTICATED, and its Step call does not disturb the coordinator's stream; `loom up` makes
a secret for its own processes (and its workers inherit none of its sockets).
"""
import os
import pathlib
import subprocess

import grpc
import pytest

import cluster_harness as h

# Outcomes that rest on time: scripts/test-slow-machine.sh runs them again on one core.
pytestmark = pytest.mark.slow_machine

SECRET_KEY = "x-loom-cluster-secret"


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cluster-secret") / "secret"
    path.write_text("\n  correct-horse-battery-staple  \n")
    return path


@pytest.fixture(scope="module")
def rig(tmp_path_factory, secret_file):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    with h.running_cluster(h.cluster_log_dir(tmp_path_factory, "cluster-secret"),
                           {"replica-a": {"threads": 1, "cluster_secret_file": secret_file}},
                           cluster_secret_file=secret_file) as rig:
        yield rig


def assert_unauthenticated(call, *args, metadata=None):
    with pytest.raises(grpc.RpcError) as refused:
        result = call(*args, timeout=10, metadata=metadata)
        for _ in result if hasattr(result, "__iter__") else ():
            pass
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value
    assert "cluster secret" in (refused.value.details() or ""), refused.value.details()
    return refused.value


def test_members_serve(rig):
    outcome = h.generate(rig.coordinator.stub, h.make_request("The capital of France is", max_tokens=8))
    assert outcome.finished, outcome.describe()
    assert outcome.completion_tokens == 8


def test_strangers_cannot_register_or_use_the_store(rig):
    wpb = h.stubs().wpb
    stub = h.stubs().worker_grpc.CoordinatorStub(rig.coordinator.channel)
    intruder = wpb.RegisterRequest(protocol_version=wpb.PROTOCOL_VERSION_CURRENT, worker_address="127.0.0.1:9",
                                   replica_id="intruder", rank=0, world_size=1, num_kv_blocks=64, block_size=16)
    for metadata in (None, [(SECRET_KEY, "wrong")], [(SECRET_KEY, "")]):
        refusal = assert_unauthenticated(stub.Register, intruder, metadata=metadata)
        assert "wrong" not in (refusal.details() or "")
        assert_unauthenticated(stub.StoreSet, wpb.StoreSetRequest(key="k", value=b"v"), metadata=metadata)
        assert_unauthenticated(stub.Heartbeat, wpb.HeartbeatRequest(worker_id="replica-a/0"), metadata=metadata)
    # The right secret passes the check (the store answers).
    stub.StoreSet(wpb.StoreSetRequest(key="k", value=b"v"), timeout=10,
                  metadata=[(SECRET_KEY, "correct-horse-battery-staple")])
    replicas = rig.coordinator.replicas()
    assert "intruder" not in replicas and replicas["replica-a"].healthy, replicas


def test_a_stranger_cannot_drive_or_interrupt_a_worker(rig):
    wpb = h.stubs().wpb
    long = h.Stream(rig.coordinator.stub, h.make_request("Once upon a time", max_tokens=48, ignore_eos=True), 120)
    assert long.wait_tokens(2, timeout=h.REGISTER_TIMEOUT_S), long.outcome.describe()
    with grpc.insecure_channel(rig.workers["replica-a"].address) as channel:
        worker = h.stubs().worker_grpc.WorkerStub(channel)
        # A Step stream would replace the coordinator's (and drop its sequences) if it got in.
        assert_unauthenticated(worker.Step, iter([wpb.StepPlan(step_id=1)]))
        assert_unauthenticated(worker.FetchKvBlocks, wpb.FetchKvBlocksRequest())
        assert_unauthenticated(worker.ReadKvBlocks, wpb.ReadKvBlocksRequest())
    outcome = long.join()
    assert outcome.finished and outcome.completion_tokens == 48, outcome.describe()


@pytest.mark.parametrize("secret", [None, "another"])
def test_a_worker_without_the_secret_is_refused_and_exits(rig, secret, tmp_path):
    flags = {"threads": 1}
    if secret is not None:
        (tmp_path / "other").write_text(secret)
        flags["cluster_secret_file"] = tmp_path / "other"
    worker = rig.add_worker(f"stranger-{secret}", wait_healthy=False, **flags)
    assert worker.wait(timeout=h.REGISTER_TIMEOUT_S) == 1, worker.log_tail()
    assert "refused this worker" in worker.log_tail() and "cluster secret" in worker.log_tail()
    assert f"stranger-{secret}" not in rig.coordinator.replicas()


def test_a_missing_secret_file_is_a_usage_error(rig, tmp_path):
    missing = tmp_path / "absent"
    for command in ([h.LOOM_BIN, "serve", "--model", h.MODEL_PATH],
                    [h.WORKER_BIN, "--model", h.MODEL_PATH, "--coordinator", "127.0.0.1:1"]):
        done = subprocess.run([*map(str, command), "--cluster-secret-file", str(missing)],
                                capture_output=True, text=True, timeout=60)
        assert done.returncode != 0, done
        assert "cluster secret file" in done.stderr and str(missing) in done.stderr, done.stderr


def sockets_of(pid: int) -> set:
    found = set()
    try:
        fds = list(pathlib.Path(f"/proc/{pid}/fd").iterdir())
    except FileNotFoundError:  # the process ended meanwhile
        return found
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def test_loom_up_makes_a_secret_for_its_own_processes(tmp_path):
    up = h.Up(tmp_path, threads=1)
    try:
        up.wait_healthy(["replica-0"])
        outcome = h.generate(up.stub, h.make_request("Hello", max_tokens=4))
        assert outcome.finished, outcome.describe()
        wpb = h.stubs().wpb
        stub = h.stubs().worker_grpc.CoordinatorStub(up.channel)
        assert_unauthenticated(stub.StoreSet, wpb.StoreSetRequest(key="k", value=b"v"))
        # Not on any command line (ps would show it).
        for pid in [up.pid, *up.children()]:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                assert b"secret" not in cmdline.read()
        # The workers hold none of the coordinator's sockets (a worker outliving a crashed
        # coordinator held its HTTP port).
        coordinator_sockets = sockets_of(up.pid)
        assert coordinator_sockets
        for child in up.children():
            assert not (sockets_of(child) & coordinator_sockets), child
    finally:
        up.stop()
