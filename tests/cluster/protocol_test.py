"""The worker protocol's registration rules and the standard gRPC services, checked by talking to
a running coordinator and worker directly: a worker of another protocol version or another model
is refused at registration (FAILED_PRECONDITION with a message naming the mismatch) and never
becomes a replica, and so is an unknown role or ranks of one replica with different roles; a heartbeat from a worker the coordinator does not know is NOT_FOUND (the
worker's cue to register again); grpc.health.v1 answers SERVING and server reflection lists the
Loom services on both processes.
"""
import re

import grpc
import pytest

import cluster_harness as h

# Raw protobuf bytes, so no extra stub packages are needed.
HEALTH_CHECK_ALL = b""                      # grpc.health.v1.HealthCheckRequest{service: ""}
HEALTH_SERVING = b"\x08\x01"                # HealthCheckResponse{status: SERVING}
REFLECTION_LIST_SERVICES = b"\x3a\x00"      # ServerReflectionRequest{list_services: ""}
REFLECTION_METHODS = ("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    with h.running_cluster(h.cluster_log_dir(tmp_path_factory, "protocol"), {"replica-a": {"threads": 1}}) as rig:
        yield rig


@pytest.fixture(scope="module")
def coordinator_stub(rig):
    return h.stubs().worker_grpc.CoordinatorStub(rig.coordinator.channel)


def register_request(rig, **overrides):
    """A registration like the running worker's (its model fingerprint from its log), for a new
    replica id, with `overrides` applied."""
    wpb = h.stubs().wpb
    log = rig.workers["replica-a"].log_path.read_text(errors="replace")
    match = re.search(r"fingerprint ([0-9a-f]{16,})", log)
    request = wpb.RegisterRequest(
        protocol_version=wpb.PROTOCOL_VERSION_CURRENT, worker_address="127.0.0.1:9", replica_id="intruder",
        rank=0, world_size=1, backend="noop", num_kv_blocks=64, block_size=16, version="test",
        model=wpb.ModelInfo(name="SmolLM2", path=str(h.MODEL_PATH), architecture="llama", vocab_size=49152,
                            context_length=8192, fingerprint=match.group(1) if match else ""))
    for field, value in overrides.items():
        if field == "fingerprint":
            request.model.fingerprint = value
        else:
            setattr(request, field, value)
    return request


def assert_refused_and_absent(rig, coordinator_stub, request, *words):
    with pytest.raises(grpc.RpcError) as refused:
        coordinator_stub.Register(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value
    details = refused.value.details() or ""
    for word in words:
        assert word in details.lower(), f"{word!r} not in the refusal message {details!r}"
    replicas = rig.coordinator.replicas()
    assert "intruder" not in replicas, replicas
    assert replicas["replica-a"].healthy, replicas


def test_worker_of_another_protocol_version_is_refused(rig, coordinator_stub):
    current = h.stubs().wpb.PROTOCOL_VERSION_CURRENT
    request = register_request(rig, protocol_version=current + 1)
    assert_refused_and_absent(rig, coordinator_stub, request, "version", str(current), str(current + 1))


def test_worker_serving_another_model_is_refused(rig, coordinator_stub):
    request = register_request(rig, fingerprint="0123456789abcdef0123456789abcdef")
    assert_refused_and_absent(rig, coordinator_stub, request, "0123456789abcdef0123456789abcdef")


def test_a_role_the_coordinator_does_not_know_and_ranks_of_different_roles_are_refused(rig, coordinator_stub):
    with pytest.raises(grpc.RpcError) as refused:
        coordinator_stub.Register(register_request(rig, role="verify"), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
    assert "unknown replica role 'verify'" in (refused.value.details() or "")
    # Two ranks of one replica, one prefill and one decode: the second is refused by name.
    coordinator_stub.Register(register_request(rig, world_size=2, rank=0, role="prefill"), timeout=10)
    request = register_request(rig, world_size=2, rank=1, role="decode", worker_address="127.0.0.1:10")
    assert_refused_and_absent(rig, coordinator_stub, request, "disagree on their role", "prefill", "decode")


@pytest.mark.parametrize("field,value,words", [
    ("kv_dtype", "f7", ("unknown kv cache dtype 'f7'",)),
    ("pipeline_parallel_size", -2, ("negative pipeline",)),
    ("num_kv_heads", -1, ("negative pipeline or kv head",)),
])
def test_malformed_registrations_are_refused_by_field(rig, coordinator_stub, field, value, words):
    with pytest.raises(grpc.RpcError) as refused:
        coordinator_stub.Register(register_request(rig, **{field: value}), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
    for word in words:
        assert word in (refused.value.details() or "").lower(), refused.value.details()
    assert "intruder" not in rig.coordinator.replicas()


def test_ranks_of_one_replica_with_different_kv_dtypes_are_refused(rig, coordinator_stub):
    coordinator_stub.Register(register_request(rig, world_size=2, rank=0, kv_dtype="f16",
                                               replica_id="mixed-dtypes"), timeout=10)
    request = register_request(rig, world_size=2, rank=1, kv_dtype="int8", replica_id="mixed-dtypes",
                               worker_address="127.0.0.1:10")
    with pytest.raises(grpc.RpcError) as refused:
        coordinator_stub.Register(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value
    assert "disagree on the kv cache dtype" in (refused.value.details() or "").lower()
    assert "mixed-dtypes" not in rig.coordinator.replicas()


def test_heartbeat_from_an_unknown_worker_is_not_found(rig, coordinator_stub):
    with pytest.raises(grpc.RpcError) as answer:
        coordinator_stub.Heartbeat(h.stubs().wpb.HeartbeatRequest(worker_id="nobody/0"), timeout=10)
    assert answer.value.code() == grpc.StatusCode.NOT_FOUND, answer.value


def raw_channel_checks(address: str, service: str):
    with grpc.insecure_channel(address) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None,
                                    response_deserializer=None)
        # The coordinator refreshes its health status periodically (~200 ms), so allow a moment.
        answers = []
        serving = h.wait_until(lambda: answers.append(check(HEALTH_CHECK_ALL, timeout=10)) or
                               answers[-1] == HEALTH_SERVING, timeout=3, interval=0.1)
        assert serving, f"{address} health is not SERVING after 3 s: {answers[-1]!r}"
        answers = []
        for method in REFLECTION_METHODS:
            reflect = channel.stream_stream(method, request_serializer=None, response_deserializer=None)
            try:
                answers = list(reflect(iter([REFLECTION_LIST_SERVICES]), timeout=10))
                break
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
        assert answers, f"{address} has no server reflection"
        assert service.encode() in b"".join(answers), f"reflection on {address} does not list {service}"


def test_coordinator_and_worker_serve_health_and_reflection(rig):
    raw_channel_checks(rig.coordinator.address, "loom.v1.Inference")
    raw_channel_checks(rig.workers["replica-a"].address, "loom.v1.Worker")
