"""Server reflection (what grpcurl uses) and the per-service health check of a coordinator,
with the Python reflection and health clients (grpcio-reflection, grpcio-health-checking).

* Reflection lists loom.v1.Inference and grpc.health.v1.Health, and describes Inference's
  methods.
* Health of "loom.v1.Inference" is NOT_SERVING while no replica can serve and SERVING once a
  worker registered; an unknown service is NOT_FOUND.
"""
import time

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from client_test_util import h, require_cluster_binaries

# Outcomes that rest on time: scripts/test-slow-machine.sh runs them again on one core.
pytestmark = pytest.mark.slow_machine


def health(channel, service: str):
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status


def wait_health(channel, service: str, want, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while True:
        status = health(channel, service)
        if status == want or time.monotonic() > deadline:
            return status
        time.sleep(0.1)


def test_reflection_lists_services_and_health_follows_replicas(tmp_path):
    require_cluster_binaries()
    with h.ClusterRig(tmp_path) as rig:
        with grpc.insecure_channel(rig.coordinator.address) as channel:
            database = ProtoReflectionDescriptorDatabase(channel)
            services = set(database.get_services())
            assert {"loom.v1.Inference", "grpc.health.v1.Health"} <= services, services
            pool = descriptor_pool.DescriptorPool(database)
            inference = pool.FindServiceByName("loom.v1.Inference")
            assert {m.name for m in inference.methods} >= {
                "Generate", "Tokenize", "Detokenize", "ListModels", "GetClusterState"}
            generate = inference.FindMethodByName("Generate")
            assert generate.output_type.full_name == "loom.v1.GenerateResponse"

            NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
            SERVING = health_pb2.HealthCheckResponse.SERVING
            assert health(channel, "loom.v1.Inference") == NOT_SERVING
            with pytest.raises(grpc.RpcError) as error:
                health(channel, "no.such.Service")
            assert error.value.code() == grpc.StatusCode.NOT_FOUND

            rig.add_worker("r0", threads=1)
            assert wait_health(channel, "loom.v1.Inference", SERVING) == SERVING
            assert wait_health(channel, "", SERVING) == SERVING
