"""The Gateway API Inference Extension's endpoint picker (`loom serve --endpoint-picker-port`,
api/endpoint_picker) over real processes, driven as a gateway drives it: Envoy's ext_proc
stream, built and read with Envoy's own generated classes (PyPI `xds-protos`), so the
wire-compatible declaration in proto/envoy_ext_proc is checked against Envoy's definitions.

What the extension's endpoint picker protocol requires, as far as it runs without Envoy:
* every routed request gets `x-gateway-destination-endpoint` as a header mutation and the
  same value under `envoy.lb` in the dynamic metadata: the leading coordinator's HTTP API;
* full-duplex streaming (the extension's mode, and the default when the proxy sends no
  protocol_config): the body is gathered, then the headers response and the whole body go
  back; the response passes through unchanged (chunks echoed); buffered mode: headers
  continue and the pick rides on the body response;
* the proxy's subset hint is honoured (a leader outside it is a 503);
* refusals are ImmediateResponses: 404 for a model the pool does not serve, 503 with no
  replica, 429 (Retry-After) when every replica's queue is full; a request without a body
  is routed unscored.
Loom's part: the replica is scored by prefix cache and load (`x-loom-replica`) and the
leader's HTTP API honours it: a prompt pinned to one replica is afterwards picked there
because that replica holds its prefix.
"""
import json
import pathlib
import re
import signal
import sys
import urllib.request

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from google.protobuf import struct_pb2

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
import cluster_harness as h  # noqa: E402

TIMEOUT_S = 60
LONG_PROMPT = " ".join(f"token{i}" for i in range(200))


class Picker:
    """A coordinator with the endpoint picker on, and an ext_proc stub to it."""

    def __init__(self, log_dir, **flags):
        self.coordinator = h.Coordinator(log_dir, endpoint_picker_port=0, **flags)
        match = self.coordinator.wait_for_line(
            r"endpoint picker \(Envoy ext_proc\) on (\S+):(\d+), picking (\S+)", TIMEOUT_S)
        self.endpoint = match.group(3)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{match.group(2)}")
        self.stub = ep_grpc.ExternalProcessorStub(self.channel)

    def process(self, messages) -> list:
        return list(self.stub.Process(iter(messages), timeout=TIMEOUT_S))

    def close(self):
        self.channel.close()
        self.coordinator.stop(timeout=10)


def request_headers(path: str, end_of_stream: bool = False, body_mode=None, subset=None,
                    method: str = "POST") -> ep.ProcessingRequest:
    headers = base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=":method", raw_value=method.encode()),
        base_pb2.HeaderValue(key=":path", raw_value=path.encode()),
        base_pb2.HeaderValue(key="content-type", raw_value=b"application/json"),
        base_pb2.HeaderValue(key="x-loom-replica", raw_value=b"forged-by-the-client")])
    message = ep.ProcessingRequest(
        request_headers=ep.HttpHeaders(headers=headers, end_of_stream=end_of_stream))
    if body_mode is not None:
        message.protocol_config.request_body_mode = body_mode
        message.protocol_config.response_body_mode = body_mode
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.update({"x-gateway-destination-endpoint-subset": subset})
        message.metadata_context.filter_metadata["envoy.lb.subset_hint"].CopyFrom(hint)
    return message


def body_messages(body: dict, chunks: int = 2) -> list:
    data = json.dumps(body).encode()
    step = (len(data) + chunks - 1) // chunks
    parts = [data[i:i + step] for i in range(0, len(data), step)]
    return [ep.ProcessingRequest(request_body=ep.HttpBody(body=part, end_of_stream=i == len(parts) - 1))
            for i, part in enumerate(parts)]


def set_headers(common) -> dict:
    return {o.header.key: (o.header.raw_value or o.header.value.encode()).decode()
            for o in common.header_mutation.set_headers}


def routed(response) -> tuple[dict, str]:
    """(headers set, the envoy.lb endpoint) of a routing answer."""
    answer = response.request_headers if response.HasField("request_headers") else response.request_body
    headers = set_headers(answer.response)
    lb = response.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    return headers, lb["x-gateway-destination-endpoint"].string_value


def completion_body(prompt: str, **extra) -> dict:
    return {"model": "", "prompt": prompt, "max_tokens": 4, **extra}


def pick(picker: Picker, body: dict, path: str = "/v1/completions") -> tuple[dict, str]:
    responses = picker.process([request_headers(path), *body_messages(body)])
    assert len(responses) == 2, responses
    return routed(responses[0])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    log_dir = tmp_path_factory.mktemp("endpoint_picker")
    picker = Picker(log_dir)
    workers = [h.Worker(log_dir, picker.coordinator.address, f"r{i}", step_backend="noop",
                        kv_cache_memory="2GiB") for i in range(2)]
    try:
        picker.coordinator.wait_healthy(["r0", "r1"], timeout=TIMEOUT_S)
        yield picker
    finally:
        for worker in workers:
            worker.stop(timeout=10)
        picker.close()


def http_completion(coordinator, body: dict, headers: dict) -> dict:
    request = urllib.request.Request(
        coordinator.http_url.split("/v1")[0] + "/v1/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        return json.loads(response.read())


def test_full_duplex_routes_to_the_leader_with_the_body_sent_back_whole(cluster):
    body = completion_body("Hello there")
    messages = [request_headers("/v1/completions"), *body_messages(body, chunks=3),
                ep.ProcessingRequest(response_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap())),
                ep.ProcessingRequest(response_body=ep.HttpBody(body=b"data: {}\n\n")),
                ep.ProcessingRequest(response_body=ep.HttpBody(body=b"data: [DONE]\n\n",
                                                               end_of_stream=True))]
    responses = cluster.process(messages)
    assert [r.WhichOneof("response") for r in responses] == [
        "request_headers", "request_body", "response_headers", "response_body", "response_body"]
    headers, metadata_endpoint = routed(responses[0])
    # The header and the metadata name the same endpoint: the leader's HTTP API.
    assert headers["x-gateway-destination-endpoint"] == metadata_endpoint == cluster.endpoint
    assert cluster.coordinator.http_url.startswith(f"http://{cluster.endpoint}")
    assert headers["x-loom-replica"] in ("r0", "r1")
    assert responses[0].request_headers.response.clear_route_cache
    streamed = responses[1].request_body.response.body_mutation.streamed_response
    assert streamed.body == json.dumps(body).encode() and streamed.end_of_stream
    echoed = [r.response_body.response.body_mutation.streamed_response for r in responses[3:]]
    assert [e.body for e in echoed] == [b"data: {}\n\n", b"data: [DONE]\n\n"]
    assert [e.end_of_stream for e in echoed] == [False, True]


def test_a_prompt_is_picked_where_its_prefix_is_cached(cluster):
    body = completion_body(LONG_PROMPT)
    first, _ = pick(cluster, body)
    other = "r1" if first["x-loom-replica"] == "r0" else "r0"
    # Served on the other replica (the leader honours x-loom-replica), whose pool then holds
    # the prompt's blocks: the picker now chooses it, by the prefix index.
    answer = http_completion(cluster.coordinator, body, {"x-loom-replica": other})
    assert answer["usage"]["completion_tokens"] == 4
    cluster.coordinator.wait_idle(timeout=TIMEOUT_S)
    again, _ = pick(cluster, body)
    assert again["x-loom-replica"] == other, (first, again)
    # A chat is scored the same way (its messages rendered by the chat template).
    chat, _ = pick(cluster, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
                   path="/v1/chat/completions")
    assert chat["x-loom-replica"] in ("r0", "r1")


def test_buffered_mode_continues_the_headers_and_answers_on_the_body(cluster):
    body = completion_body("Buffered")
    responses = cluster.process([request_headers("/v1/completions", body_mode=mode_pb2.ProcessingMode.BUFFERED),
                                 *body_messages(body, chunks=1)])
    assert [r.WhichOneof("response") for r in responses] == ["request_headers", "request_body"]
    assert not responses[0].request_headers.response.header_mutation.set_headers
    headers, endpoint = routed(responses[1])
    assert headers["x-gateway-destination-endpoint"] == endpoint == cluster.endpoint
    assert not responses[1].request_body.response.HasField("body_mutation")


def test_a_request_without_a_body_is_routed_unscored(cluster):
    responses = cluster.process([request_headers("/v1/models", end_of_stream=True, method="GET")])
    assert len(responses) == 1
    headers, endpoint = routed(responses[0])
    assert endpoint == cluster.endpoint and "x-loom-replica" not in headers
    # A client's own x-loom-replica never passes the picker.
    assert "x-loom-replica" in responses[0].request_headers.response.header_mutation.remove_headers
    # An unparsable body goes to the leader unscored too (its API answers the 400).
    responses = cluster.process([request_headers("/v1/completions"),
                                 ep.ProcessingRequest(request_body=ep.HttpBody(body=b"{not json",
                                                                               end_of_stream=True))])
    headers, endpoint = routed(responses[0])
    assert endpoint == cluster.endpoint and "x-loom-replica" not in headers


def immediate(responses) -> tuple[int, dict, dict]:
    assert responses[-1].HasField("immediate_response"), responses
    answer = responses[-1].immediate_response
    headers = {o.header.key: (o.header.raw_value or o.header.value.encode()).decode()
               for o in answer.headers.set_headers}
    return answer.status.code, json.loads(answer.body), headers


def test_the_subset_hint_and_unknown_models_are_refused(cluster):
    body = completion_body("Hello")
    allowed = cluster.process([request_headers("/v1/completions", subset=["10.0.0.9:8000", cluster.endpoint]),
                               *body_messages(body)])
    assert routed(allowed[0])[1] == cluster.endpoint
    outside = cluster.process([request_headers("/v1/completions", subset=["10.0.0.9:8000"]),
                               *body_messages(body)])
    status, error, headers = immediate(outside)
    assert status == 503 and "not among" in error["error"]["message"]
    assert headers["content-type"] == "application/json"
    status, error, _ = immediate(cluster.process([request_headers("/v1/completions"),
                                                  *body_messages(completion_body("Hi", model="gpt-9"))]))
    assert status == 404 and error["error"]["code"] == "model_not_found"


def test_a_malformed_stream_is_refused_with_a_status(cluster):
    with pytest.raises(grpc.RpcError) as error:
        cluster.process([ep.ProcessingRequest(request_body=ep.HttpBody(body=b"{}", end_of_stream=True))])
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as error:
        cluster.process([ep.ProcessingRequest()])
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # And the picker still serves.
    assert pick(cluster, completion_body("Hello"))[1] == cluster.endpoint


def picks(coordinator) -> dict:
    """loom_endpoint_picker_decisions_total by outcome, from /metrics."""
    url = coordinator.http_url.split("/v1")[0] + "/metrics"
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
        text = response.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^loom_endpoint_picker_decisions_total\{[^}]*outcome="(\w+)"[^}]*\} (\S+)$', text, re.M)}


def test_each_answer_is_counted_by_outcome(cluster):
    before = picks(cluster.coordinator)
    assert set(before) == {"scored", "unscored", "not_found", "queue_full", "unavailable"}, before
    pick(cluster, completion_body("Hello"))
    immediate(cluster.process([request_headers("/v1/completions"),
                               *body_messages(completion_body("Hi", model="gpt-9"))]))
    cluster.process([request_headers("/v1/models", end_of_stream=True, method="GET")])
    after = picks(cluster.coordinator)
    assert {k: after[k] - before[k] for k in after} == {
        "scored": 1, "unscored": 1, "not_found": 1, "queue_full": 0, "unavailable": 0}


def test_no_replica_is_a_503_and_full_queues_a_429(tmp_path):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    # The worker is stopped on purpose: liveness must not give up on it (and fail the held
    # requests) while the test counts them, however slow the machine.
    picker = Picker(tmp_path, max_num_seqs=1, max_waiting=1, step_timeout_ms=3600000,
                    heartbeat_timeout_ms=3600000)
    worker = None
    try:
        status, error, _ = immediate(picker.process([request_headers("/v1/completions"),
                                                     *body_messages(completion_body("Hi"))]))
        assert status == 503, error
        worker = h.Worker(tmp_path, picker.coordinator.address, "r0", step_backend="noop",
                          kv_cache_memory="1GiB")
        picker.coordinator.wait_healthy(["r0"], timeout=TIMEOUT_S)
        worker.signal(signal.SIGSTOP)  # what is admitted stays
        # One running, one waiting (one at a time: admission counts a request not yet
        # taken in by the replica's loop as waiting).
        streams = []
        for held in (1, 2):
            streams.append(h.Stream(picker.coordinator.stub, h.make_request("Hold", max_tokens=64),
                                    timeout=TIMEOUT_S))
            assert h.wait_until(lambda: picker.coordinator.replicas()["r0"].num_running +
                                picker.coordinator.replicas()["r0"].num_waiting == held, TIMEOUT_S)
        status, error, headers = immediate(picker.process([request_headers("/v1/completions"),
                                                           *body_messages(completion_body("Hi"))]))
        assert status == 429 and headers["retry-after"] == "1", error
        for stream in streams:
            stream.cancel()
        worker.signal(signal.SIGCONT)
        picker.coordinator.wait_idle(timeout=TIMEOUT_S)
        assert pick(picker, completion_body("Hi"))[0]["x-loom-replica"] == "r0"
    finally:
        if worker is not None:
            worker.signal(signal.SIGCONT)
            worker.stop(timeout=10)
        picker.close()
