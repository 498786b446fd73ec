"""`loom-worker` as a process against a fake coordinator (Python gRPC) on loopback.

Registration (fields, retry while nobody listens, refusal is fatal), heartbeats, the Step
stream (one result per plan, a new stream resets the worker), health and reflection, and
SIGTERM. The fake coordinator is scripted here, so this needs only the worker binary.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import importlib
import os
import pathlib
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import grpc  # grpcio and grpcio-tools: scripts/install-deps.sh; missing, the module fails
import pytest
from grpc_tools import protoc

from conftest import BUILD_DIR, MODEL_PATH, SOURCE_DIR  # noqa: E402

# Outcomes that rest on time: scripts/test-slow-machine.sh runs them again on one core.
pytestmark = pytest.mark.slow_machine

WORKER_BIN = BUILD_DIR / "worker" / "loom-worker"
SMOLLM2_BLOCK_BYTES = 30 * 2 * 3 * 64 * 16 * 2  # layers x (K, V) x kv heads x dims x 16 x f16
TIMEOUT_S = 60
DRAIN_TIMEOUT_S = 30  # loom-worker's --drain-timeout-s default (cli/worker_options.h)


def _stubs():
    import grpc_tools
    out_dir = tempfile.mkdtemp(prefix="loom_worker_stubs_")
    atexit.register(shutil.rmtree, out_dir, True)
    proto_dir = SOURCE_DIR / "proto"
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = ["grpc_tools.protoc", f"-I{proto_dir}", f"-I{well_known}", f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}", str(proto_dir / "loom" / "v1" / "worker.proto")]
    assert protoc.main(args) == 0
    sys.path.insert(0, out_dir)
    importlib.invalidate_caches()
    return (importlib.import_module("loom.v1.worker_pb2"),
            importlib.import_module("loom.v1.worker_pb2_grpc"))


pb, pb_grpc = _stubs()


class FakeCoordinator(pb_grpc.CoordinatorServicer):
    """Records Register and Heartbeat calls; `refuse` answers FAILED_PRECONDITION."""

    def __init__(self, refuse: str | None = None, port: int = 0, unavailable_attempts: int = 0):
        self.refuse = refuse
        self.unavailable_attempts = unavailable_attempts  # answered UNAVAILABLE first
        self.attempt_times: list[float] = []  # time.monotonic() of every Register call
        self.registrations: "queue.Queue" = queue.Queue()
        self.heartbeats: "queue.Queue" = queue.Queue()
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_CoordinatorServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        assert port in (0, self.port)
        self.server.start()
        self.address = f"127.0.0.1:{self.port}"

    def Register(self, request, context):
        self.attempt_times.append(time.monotonic())
        if len(self.attempt_times) <= self.unavailable_attempts:
            context.abort(grpc.StatusCode.UNAVAILABLE, "not yet")
        self.registrations.put(request)
        if self.refuse:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.refuse)
        return pb.RegisterResponse(worker_id="worker-1", heartbeat_interval_ms=50)

    def Heartbeat(self, request, context):
        self.heartbeats.put(request)
        return pb.HeartbeatResponse()

    def stop(self):
        self.server.stop(0)


class WorkerProcess:
    def __init__(self, coordinator: str, tmp_path: pathlib.Path, *flags: str):
        if not WORKER_BIN.exists():
            pytest.fail(f"{WORKER_BIN} is missing: build the project first")
        self.stderr_path = tmp_path / "worker.stderr"
        self.proc = subprocess.Popen(
            [str(WORKER_BIN), "--model", str(MODEL_PATH), "--coordinator", coordinator,
             "--listen", "127.0.0.1:0", "--threads", "1", *flags],
            stdout=subprocess.PIPE, stderr=open(self.stderr_path, "w"), text=True)
        self.lines: "queue.Queue" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.address = None

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_listening(self) -> str:
        line = self.lines.get(timeout=TIMEOUT_S)
        assert line is not None and line.startswith("loom-worker: listening on "), (
            line, self.stderr())
        self.address = line.split()[-1]
        return self.address

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def terminate(self, timeout: float = 15) -> tuple[int, float]:
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        return code, time.monotonic() - start

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def coordinator():
    fake = FakeCoordinator()
    yield fake
    fake.stop()


def _greedy(seq_id, prompt):
    return pb.NewSequence(seq_id=seq_id, prompt_token_ids=prompt, sampling=pb.SamplingParams(
        temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
        presence_penalty=0.0, frequency_penalty=0.0, seed=0, num_logprobs=1))


def _run_plans(stub, plans):
    """Sends every plan on one stream and returns the results."""
    responses = stub.Step(iter(plans), timeout=TIMEOUT_S)
    return list(responses)


def _prefill_and_decode_plans(first_step: int):
    prompt = [504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 7493, 314, 11657, 30]
    plans = [pb.StepPlan(step_id=first_step, added=[_greedy(1, prompt)],
                         scheduled=[pb.ScheduledSequence(seq_id=1, new_block_ids=[3],
                                                         num_tokens=len(prompt), sample=True)])]
    for i in range(3):
        blocks = [7] if len(prompt) + i == 16 else []
        plans.append(pb.StepPlan(step_id=first_step + 1 + i, scheduled=[pb.ScheduledSequence(
            seq_id=1, new_block_ids=blocks, num_tokens=1, sample=True)]))
    return plans


def test_registers_serves_steps_and_stops_on_sigterm(coordinator, tmp_path):
    worker = WorkerProcess(coordinator.address, tmp_path, "--kv-cache-memory",
                           str(40 * SMOLLM2_BLOCK_BYTES + 1000), "--replica-id", "r-test")
    try:
        address = worker.wait_listening()
        request = coordinator.registrations.get(timeout=TIMEOUT_S)
        assert request.protocol_version == pb.PROTOCOL_VERSION_CURRENT
        assert request.worker_address == address
        assert request.replica_id == "r-test" and request.rank == 0 and request.world_size == 1
        assert request.backend == "cpu"
        assert request.num_kv_blocks == 40 and request.block_size == 16
        assert request.model.architecture == "llama"
        assert request.model.vocab_size == 49152
        assert len(request.model.fingerprint) == 32
        int(request.model.fingerprint, 16)
        heartbeat = coordinator.heartbeats.get(timeout=TIMEOUT_S)
        assert heartbeat.worker_id == "worker-1" and heartbeat.num_kv_blocks == 40

        channel = grpc.insecure_channel(address)
        stub = pb_grpc.WorkerStub(channel)
        results = _run_plans(stub, _prefill_and_decode_plans(1))
        assert [r.step_id for r in results] == [1, 2, 3, 4]
        assert all(r.error_code == 0 for r in results), [r.error_message for r in results]
        tokens = [r.outputs[0].token_id for r in results]
        assert all(0 <= t < 49152 for t in tokens)
        assert results[0].num_tokens == 14 and results[1].num_tokens == 1
        assert results[0].outputs[0].logprob < 0 and len(results[0].outputs[0].top_logprobs) == 1

        # A new stream starts from nothing: the same plans give the same greedy tokens, and
        # a decode of a sequence of the old stream is an error result, not a crash.
        again = _run_plans(stub, _prefill_and_decode_plans(1))
        assert [r.outputs[0].token_id for r in again] == tokens
        stale = _run_plans(stub, [pb.StepPlan(step_id=1, scheduled=[
            pb.ScheduledSequence(seq_id=1, num_tokens=1, sample=True)])])
        assert stale[0].error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "unknown" in stale[0].error_message

        # Health (grpc.health.v1, SERVING = field 1 varint 1) and reflection are served.
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda _: b"",
                                    response_deserializer=lambda raw: raw)
        assert check(None, timeout=5) == b"\x08\x01"
        reflect = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=lambda raw: raw, response_deserializer=lambda raw: raw)
        listing = b"".join(reflect(iter([b"\x3a\x00"]), timeout=5))  # list_services: ""
        assert b"loom.v1.Worker" in listing
        channel.close()

        # SIGTERM asks the coordinator to drain (this fake does not implement Drain) and stops
        # at once: nothing waits out the drain timeout. Judged by the control flow, not by
        # this machine's speed: the exit must come before the drain timeout (a sleep any
        # machine honours) and the log must show the refused drain.
        code, seconds = worker.terminate(timeout=DRAIN_TIMEOUT_S + 30)
        assert code == 0, worker.stderr()
        assert seconds < DRAIN_TIMEOUT_S, worker.stderr()
        assert "drain: UNIMPLEMENTED" in worker.stderr(), worker.stderr()
    finally:
        worker.kill()


def _heartbeat_after(coordinator, when: float):
    """A heartbeat whose snapshot was taken after time.monotonic() `when`: drops what arrived
    before, and the next one too (it may have been on its way)."""
    time.sleep(max(0.0, when - time.monotonic()))
    while True:
        try:
            coordinator.heartbeats.get_nowait()
        except queue.Empty:
            break
    coordinator.heartbeats.get(timeout=TIMEOUT_S)
    return coordinator.heartbeats.get(timeout=TIMEOUT_S)


def test_heartbeat_reports_step_progress_and_a_stuck_step_freezes_it(coordinator, tmp_path):
    """The heartbeat thread reports the executor's progress: it advances with every step (two
    units per layer on the CPU forward pass), and a step stuck inside (--debug-hang-at-step) freezes
    the count while the heartbeats go on; SIGTERM still stops the worker."""
    worker = WorkerProcess(coordinator.address, tmp_path, "--kv-cache-memory",
                           str(40 * SMOLLM2_BLOCK_BYTES + 1000), "--debug-hang-at-step", "9")
    try:
        address = worker.wait_listening()
        coordinator.registrations.get(timeout=TIMEOUT_S)
        channel = grpc.insecure_channel(address)
        stub = pb_grpc.WorkerStub(channel)
        plans = _prefill_and_decode_plans(1)
        results = _run_plans(stub, plans)
        assert all(r.error_code == 0 for r in results), [r.error_message for r in results]
        idle = _heartbeat_after(coordinator, time.monotonic())
        units_per_step = 2 + 2 * 30  # SmolLM2-135M: 30 layers
        assert idle.progress.units_per_step == units_per_step, idle
        assert idle.progress.steps_started == 4 and idle.progress.step_id == 4, idle
        assert not idle.progress.running, idle
        assert idle.progress.units_done == 4 * units_per_step, idle

        # The ninth plan executed (step 5 of a second stream) hangs: its start is counted, then
        # nothing moves; heartbeats go on.
        hung_plan = pb.StepPlan(step_id=5, scheduled=[pb.ScheduledSequence(seq_id=1, num_tokens=1, sample=True)])
        call = stub.Step(iter([*plans, hung_plan]), timeout=TIMEOUT_S)
        first = _heartbeat_after(coordinator, time.monotonic())
        deadline = time.monotonic() + TIMEOUT_S
        while first.progress.steps_started < 9 and time.monotonic() < deadline:
            first = _heartbeat_after(coordinator, time.monotonic())
        assert first.progress.running and first.progress.step_id == 5, first
        later = _heartbeat_after(coordinator, time.monotonic() + 0.5)
        assert later.progress == first.progress, (first, later)
        call.cancel()
        channel.close()
        code, _ = worker.terminate()
        assert code == 0, worker.stderr()
        assert "--debug-hang-at-step 9: step hangs" in worker.stderr()
    finally:
        worker.kill()


def test_keeps_retrying_without_a_coordinator_and_exits_zero_on_sigterm(tmp_path):
    worker = WorkerProcess("127.0.0.1:1", tmp_path, "--step-backend", "noop")
    try:
        worker.wait_listening()
        time.sleep(1.5)
        assert worker.proc.poll() is None, worker.stderr()
        code, _ = worker.terminate()
        assert code == 0, worker.stderr()
        assert "retrying" in worker.stderr()
    finally:
        worker.kill()


def test_registers_once_the_coordinator_comes_up(tmp_path):
    # Reserve a port, start the worker against it, then start the coordinator there.
    probe = FakeCoordinator()
    port = probe.port
    probe.stop()
    worker = WorkerProcess(f"127.0.0.1:{port}", tmp_path, "--step-backend", "noop")
    try:
        worker.wait_listening()
        time.sleep(1.0)
        late = FakeCoordinator(port=port)
        try:
            # Its timing is the backoff test's subject (below), measured there without a race.
            request = late.registrations.get(timeout=TIMEOUT_S)
            assert request.backend == "noop"
        finally:
            late.stop()
        assert worker.terminate()[0] == 0
    finally:
        worker.kill()


HANDLER_JITTER_S = 0.05


def test_registration_backoff_doubles_from_100_ms_and_is_capped_at_2_s(tmp_path):
    """The worker retries a failed registration after 0.1, 0.2, 0.4, 0.8, 1.6, 2, 2 s
    (worker/registration.h). Observed as the gaps between the Register calls a fake answers
    UNAVAILABLE seven times. Independent of this machine's speed: every gap is a sleep plus one
    attempt's work, so it is at least its backoff on any machine, and the cap is judged by the
    ratio of neighbouring gaps (about 1 at the cap, 2 if the backoff kept doubling), in which
    a slower machine's per-attempt work appears on both sides. The fake stamps a call when its
    Python handler runs, which on a loaded machine can be some milliseconds after the call
    arrived: a late stamp shortens the next gap by as much (7.5 ms seen in a full suite run), so
    a gap may fall HANDLER_JITTER_S short of its backoff, still far from no backoff at all."""
    backoffs = [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    fake = FakeCoordinator(unavailable_attempts=len(backoffs))
    worker = WorkerProcess(fake.address, tmp_path, "--step-backend", "noop")
    try:
        request = fake.registrations.get(timeout=TIMEOUT_S)  # the attempt after the refusals
        assert request.backend == "noop"
        times = fake.attempt_times[:len(backoffs) + 1]
        gaps = [b - a for a, b in zip(times, times[1:])]
        described = ", ".join(f"{g:.3f}" for g in gaps)
        print(f"registration gaps {described} s")
        for gap, backoff in zip(gaps, backoffs):
            assert gap >= backoff - HANDLER_JITTER_S, f"gaps {described} s, backoffs {backoffs}"
        # Uncapped, the last gaps would be 3.2 and 6.4 s: ratios 2 where the cap gives 1.25, 1.
        assert gaps[5] < 1.5 * gaps[4] and gaps[6] < 1.5 * gaps[5], f"gaps {described} s"
        assert worker.terminate()[0] == 0
    finally:
        worker.kill()
        fake.stop()


def test_refusal_by_the_coordinator_is_fatal(tmp_path):
    fake = FakeCoordinator(refuse="protocol version 7 is not 1")
    worker = WorkerProcess(fake.address, tmp_path, "--step-backend", "noop")
    try:
        worker.wait_listening()
        code = worker.proc.wait(timeout=TIMEOUT_S)
        assert code != 0
        assert "protocol version 7 is not 1" in worker.stderr()
    finally:
        worker.kill()
        fake.stop()


@pytest.mark.parametrize("flags, message", [
    (("--world-size", "10"), "more than the model's 9 attention heads"),
    (("--world-size", "3", "--step-backend", "noop"), "needs --step-backend model"),
    (("--world-size", "3", "--rank", "3"), "outside"),
    (("--kv-cache-memory", "1KiB"), "holds no block"),
    (("--backend", "tpu"), "--backend"),
    (("--step-backend", "tpu"), "--step-backend"),
])
def test_bad_command_lines_exit_2(tmp_path, flags, message):
    proc = subprocess.run(
        [str(WORKER_BIN), "--model", str(MODEL_PATH), "--coordinator", "127.0.0.1:1", *flags],
        capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
