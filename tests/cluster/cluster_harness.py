"""Real Loom processes on loopback for the cluster tests and the benchmarks.

* Protocol stubs: generated at run time from proto/loom/v1/*.proto with grpc_tools.protoc into a
  temporary folder (never committed); `stubs()` returns them (inference_pb2, worker_pb2,
  inference_pb2_grpc).
* Processes: `Coordinator` (`loom serve`), `Worker` (`loom-worker`) and `Up` (`loom up`), each in
  its own process group, stderr in a log file, stdout read line by line so the tests can wait for
  the "listening on HOST:PORT" lines. Every wait has a timeout; `stop()` ends the process group
  (SIGCONT first, for a stopped worker) and an atexit hook kills whatever a crashed test left.
* Client: `Stream` runs one Generate call (always with a deadline) on a thread and records every
  message with its arrival time; `Outcome` is how it ended: a finish reason or a gRPC status.
  `generate_all` runs many side by side.
* `loom_generate` runs the in-process engine (`loom generate`), the reference for greedy text.

Nothing here depends on pytest, so bench/ uses it too; failures raise HarnessError with the tails
of the process logs.
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import importlib
import json
import os
import pathlib
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Callable, Iterable, Optional

import grpc

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BUILD_DIR = pathlib.Path(os.environ.get("LOOM_BUILD_DIR", SOURCE_DIR / "build"))
MODEL_PATH = pathlib.Path(
    os.environ.get("LOOM_MODEL_PATH", SOURCE_DIR / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
LOOM_BIN = BUILD_DIR / "coordinator" / "loom"
WORKER_BIN = pathlib.Path(os.environ.get("LOOM_WORKER_BIN") or BUILD_DIR / "worker" / "loom-worker")

STARTUP_TIMEOUT_S = 60      # a process prints its listening line
REGISTER_TIMEOUT_S = 60     # workers registered and healthy
STOP_TIMEOUT_S = 15         # SIGTERM to exit, before SIGKILL
RPC_TIMEOUT_S = 10          # unary RPCs (GetClusterState)
# SmolLM2-135M: 30 layers x (K, V) x 3 KV heads x 64 dims x 16 tokens x 2 bytes (f16 KV).
SMOLLM2_BLOCK_BYTES = 30 * 2 * 3 * 64 * 16 * 2  # 368640


class HarnessError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------
# Stubs.

@dataclasses.dataclass(frozen=True)
class Stubs:
    pb: object        # loom.v1.inference_pb2 (GenerateRequest, ClusterState, FinishReason...)
    wpb: object       # loom.v1.worker_pb2 (SamplingParams)
    grpc_pb: object   # loom.v1.inference_pb2_grpc (InferenceStub)
    worker_grpc: object  # loom.v1.worker_pb2_grpc (CoordinatorStub, WorkerStub)


@functools.lru_cache(maxsize=1)
def stubs() -> Stubs:
    """Generates the Python stubs of proto/loom/v1 into a temporary folder and imports them."""
    from grpc_tools import protoc  # grpcio-tools
    import grpc_tools

    out_dir = tempfile.mkdtemp(prefix="loom_stubs_")
    atexit.register(shutil.rmtree, out_dir, True)
    proto_dir = SOURCE_DIR / "proto"
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    sources = [str(proto_dir / "loom" / "v1" / name) for name in ("worker.proto", "inference.proto")]
    args = ["grpc_tools.protoc", f"-I{proto_dir}", f"-I{well_known}", f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}", *sources]
    if protoc.main(args) != 0:
        raise HarnessError(f"grpc_tools.protoc failed on {sources}")
    sys.path.insert(0, out_dir)
    importlib.invalidate_caches()
    return Stubs(pb=importlib.import_module("loom.v1.inference_pb2"),
                 wpb=importlib.import_module("loom.v1.worker_pb2"),
                 grpc_pb=importlib.import_module("loom.v1.inference_pb2_grpc"),
                 worker_grpc=importlib.import_module("loom.v1.worker_pb2_grpc"))


def require_binaries(*paths: pathlib.Path) -> Optional[str]:
    """None when every binary exists, else a message naming the missing ones."""
    missing = [str(p) for p in paths if not p.exists()]
    return f"missing {', '.join(missing)}: build the project first" if missing else None


def cluster_log_dir(tmp_path_factory, name: str) -> pathlib.Path:
    """A fresh log folder for a test module's cluster; fails the test when `loom` or
    `loom-worker` is not built."""
    missing = require_binaries(LOOM_BIN, WORKER_BIN)
    if missing:
        import pytest
        pytest.fail(missing)
    return tmp_path_factory.mktemp(name)


def serve_supported() -> bool:
    """Whether the built `loom` has the `serve` command."""
    if not LOOM_BIN.exists():
        return False
    try:
        done = subprocess.run([str(LOOM_BIN), "--help"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return False
    return re.search(r"^\s*serve\b", done.stdout + done.stderr, re.M) is not None


# ---------------------------------------------------------------------------------------------
# Processes.

_LIVE: "set[Process]" = set()


@atexit.register
def _kill_leftovers():
    for process in list(_LIVE):
        process.kill()


class Process:
    """One child process in its own process group; stdout lines are kept and can be awaited."""

    def __init__(self, args: list[str], name: str, log_dir: pathlib.Path, env: Optional[dict] = None):
        self.args = [str(a) for a in args]
        self.name = name
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.{int(time.time() * 1000) % 10**8}.log"
        self._log = open(self.log_path, "w")
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self._eof = False
        self.popen = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                      bufsize=1, start_new_session=True,
                                      env={**os.environ, **(env or {})})
        _LIVE.add(self)
        threading.Thread(target=self._pump, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _pump(self):
        for line in self.popen.stdout:
            with self._cond:
                self._lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def stdout_lines(self) -> list[str]:
        with self._cond:
            return list(self._lines)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            text = ""
        out = "\n".join(self.stdout_lines())
        return (f"--- {self.name} (pid {self.pid}, rc {self.popen.poll()}) {' '.join(self.args)}\n"
                f"stdout: {out[-1000:]}\nstderr: {text[-chars:]}")

    def wait_for_line(self, pattern: str, timeout: float) -> re.Match:
        """The first stdout line matching `pattern`; HarnessError on timeout or exit."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        exited_at = None
        seen = 0
        with self._cond:
            while True:
                for line in self._lines[seen:]:
                    match = regex.search(line)
                    if match:
                        return match
                seen = len(self._lines)
                if exited_at is None and self.popen.poll() is not None:
                    exited_at = time.monotonic()
                # EOF, or exited a while ago (children of `loom up` may hold the pipe open).
                if self._eof or (exited_at is not None and time.monotonic() - exited_at > 1):
                    raise HarnessError(f"{self.name} exited before printing /{pattern}/\n"
                                       f"{self.log_tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HarnessError(f"{self.name} printed no line matching /{pattern}/ within "
                                       f"{timeout}s\n{self.log_tail()}")
                self._cond.wait(timeout=min(left, 0.2))

    def _startup_line(self, pattern: str) -> re.Match:
        """wait_for_line for a constructor: a process that fails to start is killed."""
        try:
            return self.wait_for_line(pattern, STARTUP_TIMEOUT_S)
        except BaseException:
            self.kill()
            raise

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int):
        if self.alive():
            os.kill(self.pid, sig)

    def wait(self, timeout: float) -> Optional[int]:
        """The exit code, or None when still running after `timeout`."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def _signal_group(self, sig: int):
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self):
        """SIGKILL to the whole group (children of `loom up` included)."""
        self._signal_group(signal.SIGCONT)
        self._signal_group(signal.SIGKILL)
        self.wait(timeout=10)
        self._close()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> Optional[int]:
        """SIGTERM (after SIGCONT), then SIGKILL past `timeout`; the exit code of a clean stop."""
        if self.alive():
            self._signal_group(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            rc = self.wait(timeout)
            if rc is None:
                self.kill()
                return None
        # Whatever is left in the group (workers of `loom up`).
        self._signal_group(signal.SIGKILL)
        self._close()
        return self.popen.returncode

    def _close(self):
        _LIVE.discard(self)
        if not self._log.closed:
            self._log.close()


def _flag_args(flags: dict) -> list[str]:
    args = []
    for key, value in flags.items():
        if value is None:
            continue
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


class Coordinator(Process):
    """`loom serve` on 127.0.0.1 and free gRPC and HTTP ports (flags as keyword arguments:
    max_waiting=2). `http_url` is the OpenAI-compatible API's base URL."""

    def __init__(self, log_dir: pathlib.Path, model: pathlib.Path = MODEL_PATH, name="coordinator",
                 command: str = "serve", **flags):
        flags.setdefault("http_port", 0)
        args = [LOOM_BIN, command, "--model", model, "--host", "127.0.0.1", "--grpc-port", "0",
                *_flag_args(flags)]
        super().__init__(args, name, log_dir)
        match = self._startup_line(r"loom: coordinator listening on (\S+):(\d+)")
        self.host, self.port = match.group(1), int(match.group(2))
        self.address = f"127.0.0.1:{self.port}"
        self.http_url = None
        if flags["http_port"] != -1:
            match = self._startup_line(r"loom: OpenAI-compatible HTTP API on (https?://\S+)")
            self.http_url = match.group(1)
        self.channel = grpc.insecure_channel(self.address)
        self.stub = stubs().grpc_pb.InferenceStub(self.channel)

    def status(self, timeout: float = RPC_TIMEOUT_S):
        return self.stub.GetClusterState(stubs().pb.GetClusterStateRequest(), timeout=timeout)

    def replicas(self) -> dict:
        """replica_id -> ReplicaStatus."""
        return {r.replica_id: r for r in self.status().replicas}

    def wait_replicas(self, predicate: Callable[[dict], bool], timeout: float, what: str) -> dict:
        """Polls GetClusterState until predicate(replicas) holds; HarnessError past `timeout`."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            try:
                last = self.replicas()
                if predicate(last):
                    return last
            except grpc.RpcError as error:
                last = f"GetClusterState: {error.code()} {error.details()}"
            if time.monotonic() > deadline:
                raise HarnessError(f"not within {timeout}s: {what}; last status: {last}\n{self.log_tail()}")
            time.sleep(0.05)

    def wait_healthy(self, replica_ids: Iterable[str], timeout: float = REGISTER_TIMEOUT_S) -> dict:
        ids = list(replica_ids)
        return self.wait_replicas(lambda r: all(i in r and r[i].healthy for i in ids), timeout,
                                  f"replicas {ids} healthy")

    def wait_idle(self, timeout: float = 15) -> dict:
        """Every healthy replica has no running or waiting sequence and all its blocks free."""
        return self.wait_replicas(
            lambda r: all(s.num_running == 0 and s.num_waiting == 0 and s.num_free_blocks == s.num_kv_blocks
                          for s in r.values() if s.healthy),
            timeout, "every healthy replica idle with all KV blocks free")

    def _close(self):
        if getattr(self, "channel", None) is not None:
            self.channel.close()
        super()._close()


class Up(Coordinator):
    """`loom up`: a coordinator and its worker children."""

    def __init__(self, log_dir: pathlib.Path, model: pathlib.Path = MODEL_PATH, **flags):
        super().__init__(log_dir, model, name="loom-up", command="up", **flags)

    def children(self) -> list[int]:
        return child_pids(self.pid)


class Worker(Process):
    """`loom-worker` registering with `coordinator_address` (flags: threads=1, kv_cache_memory=...)."""

    def __init__(self, log_dir: pathlib.Path, coordinator_address: str, replica_id: str,
                 model: pathlib.Path = MODEL_PATH, **flags):
        flags.setdefault("threads", 1)
        args = [WORKER_BIN, "--model", model, "--coordinator", coordinator_address,
                "--listen", "127.0.0.1:0", "--replica-id", replica_id, *_flag_args(flags)]
        super().__init__(args, f"worker-{replica_id}", log_dir)
        self.replica_id = replica_id
        match = self._startup_line(r"loom-worker: listening on (\S+):(\d+)")
        self.address = f"{match.group(1)}:{match.group(2)}"


def child_pids(pid: int) -> list[int]:
    """Live (non-zombie) processes whose parent is `pid`."""
    out = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def pid_alive(pid: int) -> bool:
    """True for a live, non-zombie process."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


class ClusterRig:
    """A coordinator and workers started together and stopped together (use as a context manager).

    rig = ClusterRig(log_dir, coordinator_flags={...}); rig.add_worker("r0", threads=1); ...
    """

    def __init__(self, log_dir: pathlib.Path, **coordinator_flags):
        self.log_dir = log_dir
        self.workers: dict[str, Worker] = {}
        self.processes: list[Process] = []
        self.coordinator = Coordinator(log_dir, **coordinator_flags)
        self.processes.append(self.coordinator)

    def add_worker(self, replica_id: str, wait_healthy: bool = True, **flags) -> Worker:
        worker = Worker(self.log_dir, self.coordinator.address, replica_id, **flags)
        self.processes.append(worker)
        self.workers[replica_id] = worker
        if wait_healthy:
            self.coordinator.wait_healthy([replica_id])
        return worker

    def logs(self) -> str:
        return "\n".join(p.log_tail() for p in self.processes)

    def close(self):
        for process in reversed(self.processes):
            process.stop(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@contextlib.contextmanager
def running_cluster(log_dir: pathlib.Path, workers: dict, print_logs: bool = True, **coordinator_flags):
    """A coordinator (`loom serve` with coordinator_flags) and one worker per entry of `workers`
    (replica_id -> worker flags), all registered and healthy; everything is stopped on exit,
    and the process logs are printed (pytest shows them for a failed test)."""
    rig = ClusterRig(log_dir, **coordinator_flags)
    try:
        for replica_id, flags in workers.items():
            rig.add_worker(replica_id, wait_healthy=False, **flags)
        rig.coordinator.wait_healthy(workers)
        yield rig
    finally:
        rig.close()
        if print_logs:
            print(rig.logs())


# ---------------------------------------------------------------------------------------------
# Client.

@dataclasses.dataclass
class Outcome:
    """How one Generate call ended."""
    request: object
    text: str = ""
    token_ids: list = dataclasses.field(default_factory=list)
    finish_reason: int = 0             # FinishReason value of the last message (0: none)
    error_message: str = ""
    code: Optional[grpc.StatusCode] = None  # OK, or the call's error status
    details: str = ""
    replica_id: str = ""
    last_replica_id: str = ""          # the replica of its last message (a hand-off or migration moves it)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: list = dataclasses.field(default_factory=list)  # SequenceOutputs, when asked for
    num_draft_tokens: int = 0          # speculative decoding, from the last message
    num_accepted_tokens: int = 0
    num_messages: int = 0
    started: float = 0.0
    first_token_at: Optional[float] = None
    ended_at: Optional[float] = None

    @property
    def finished(self) -> bool:
        """Ended with a final message carrying a finish reason."""
        return self.code == grpc.StatusCode.OK and self.finish_reason != 0

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    def reason_name(self) -> str:
        return stubs().pb.FinishReason.Name(self.finish_reason)

    def describe(self) -> str:
        return (f"code={self.code} details={self.details!r} finish={self.reason_name()} "
                f"error={self.error_message!r} replica={self.replica_id!r} tokens={len(self.token_ids)} "
                f"text={self.text[:80]!r}")


class Stream:
    """One Generate call consumed on its own thread, with a deadline."""

    def __init__(self, stub, request, timeout: float):
        self.outcome = Outcome(request=request)
        self._cond = threading.Condition()
        self._timeout = timeout
        self.outcome.started = time.monotonic()
        self._call = stub.Generate(request, timeout=timeout)
        self._thread = threading.Thread(target=self._consume, daemon=True)
        self._thread.start()

    def _consume(self):
        o = self.outcome
        try:
            for message in self._call:
                with self._cond:
                    now = time.monotonic()
                    o.num_messages += 1
                    if message.token_ids and o.first_token_at is None:
                        o.first_token_at = now
                    o.text += message.text
                    o.token_ids.extend(message.token_ids)
                    o.logprobs.extend(message.logprobs)
                    if message.replica_id and not o.replica_id:
                        o.replica_id = message.replica_id
                    if message.replica_id:
                        o.last_replica_id = message.replica_id
                    if message.finish_reason:
                        o.finish_reason = message.finish_reason
                        o.error_message = message.error_message
                        o.prompt_tokens = message.prompt_tokens
                        o.completion_tokens = message.completion_tokens
                        o.num_draft_tokens = message.num_draft_tokens
                        o.num_accepted_tokens = message.num_accepted_tokens
                    self._cond.notify_all()
            o.code = grpc.StatusCode.OK
        except grpc.RpcError as error:
            o.code = error.code()
            o.details = error.details() or ""
        except Exception as error:  # noqa: BLE001 - recorded, the test asserts on it
            o.code = grpc.StatusCode.UNKNOWN
            o.details = f"client exception: {error!r}"
        with self._cond:
            o.ended_at = time.monotonic()
            self._cond.notify_all()

    def wait_tokens(self, n: int, timeout: float) -> bool:
        """True once n tokens arrived; False when the call ended first or past `timeout`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.outcome.token_ids) < n:
                left = deadline - time.monotonic()
                if self.outcome.ended_at is not None or left <= 0:
                    return False
                self._cond.wait(timeout=min(left, 0.5))
            return True

    def cancel(self):
        self._call.cancel()

    def done(self) -> bool:
        return self.outcome.ended_at is not None

    def join(self, timeout: Optional[float] = None) -> Outcome:
        """The outcome; raises HarnessError when the call has not ended within `timeout` (the
        call's own deadline plus a margin by default), which means the client hung."""
        self._thread.join(timeout=self._timeout + 10 if timeout is None else timeout)
        if self._thread.is_alive():
            self._call.cancel()
            raise HarnessError(f"Generate did not end within its deadline ({self._timeout}s) + margin")
        return self.outcome


def make_request(prompt=None, token_ids=None, max_tokens: int = 16, temperature=None, top_p=None,
                 top_k=None, seed=None, stop=(), stop_token_ids=(), ignore_eos=False, priority=0,
                 request_id="", num_speculative_tokens=None, num_logprobs=None):
    """A GenerateRequest; fields left None stay unset (server defaults)."""
    s = stubs()
    sampling = s.wpb.SamplingParams()
    for field, value in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k), ("seed", seed),
                         ("num_logprobs", num_logprobs)):
        if value is not None:
            setattr(sampling, field, value)
    request = s.pb.GenerateRequest(sampling=sampling, max_tokens=max_tokens, stop=list(stop),
                                   stop_token_ids=list(stop_token_ids), ignore_eos=ignore_eos,
                                   priority=priority, request_id=request_id)
    if num_speculative_tokens is not None:
        request.num_speculative_tokens = num_speculative_tokens
    if token_ids is not None:
        request.token_ids.SetInParent()  # an empty list still selects the token_ids prompt
        request.token_ids.ids.extend(token_ids)
    else:
        request.text = prompt
    return request


def generate(stub, request, timeout: float = 60) -> Outcome:
    return Stream(stub, request, timeout).join()


def generate_all(stub, requests: list, timeout: float = 120) -> list[Outcome]:
    """Every request as its own concurrent call (deadline `timeout` each); outcomes in order."""
    streams = [Stream(stub, request, timeout) for request in requests]
    return [stream.join() for stream in streams]


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def leader_and_standby(log_dir: pathlib.Path, processes: list, timeout: float = 60,
                       leader_flags: Optional[dict] = None, standby_flags: Optional[dict] = None):
    """Two coordinators sharing the lock file log_dir/leader.lock (`--leader-lock`): the first
    leads (waited for), the second follows. Both are appended to `processes`, for the caller's
    `stop_all` (a failed start leaves the ones started there too)."""
    lock = log_dir / "leader.lock"
    leader = Coordinator(log_dir, name="coordinator-a", leader_lock=lock, **(leader_flags or {}))
    processes.append(leader)
    leader.wait_for_line(r"loom: leading", timeout)
    standby = Coordinator(log_dir, name="coordinator-b", leader_lock=lock, **(standby_flags or {}))
    processes.append(standby)
    return leader, standby


def stop_all(processes: list, timeout: float = 5):
    """Stops `processes` last started first, then prints each one's log tail."""
    for process in reversed(processes):
        process.stop(timeout=timeout)
    for process in processes:
        print(process.log_tail())


def wait_stopped(pid: int, timeout: float = 120):
    """Until the kernel reports `pid` stopped (SIGSTOP's effect is not synchronous);
    HarnessError past `timeout`."""
    def stopped():
        with open(f"/proc/{pid}/status") as status:
            state = next(line for line in status if line.startswith("State:"))
        return "T" in state.split()[1]
    if not wait_until(stopped, timeout, interval=0.01):
        raise HarnessError(f"process {pid} did not stop within {timeout} s")


def http_ready(coordinator) -> tuple[int, dict]:
    """GET /ready of a coordinator's HTTP API: (status, JSON body), 503 included."""
    base = coordinator.http_url.split("/v1")[0]
    try:
        with urllib.request.urlopen(f"{base}/ready", timeout=RPC_TIMEOUT_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


# ---------------------------------------------------------------------------------------------
# The in-process reference.

@dataclasses.dataclass
class LocalGeneration:
    text: str              # the continuation (the prompt and the final newline removed)
    decode_tokens: int
    decode_seconds: float
    decode_tokens_per_s: float


_TIMING = re.compile(r"decode: (\d+) tokens in ([0-9.]+) s \(([0-9.]+) tokens/s\)")


def loom_generate(prompt: str, max_tokens: int, model: pathlib.Path = MODEL_PATH, threads: int = 2,
                  timeout: float = 120, extra: Iterable[str] = ()) -> LocalGeneration:
    """`loom generate` (greedy unless `extra` says otherwise)."""
    args = [str(LOOM_BIN), "generate", "--model", str(model), "--prompt", prompt,
            "--max-tokens", str(max_tokens), "--threads", str(threads), *extra]
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise HarnessError(f"{' '.join(args)} exited with {done.returncode}: {done.stderr[-2000:]}")
    out = done.stdout
    if not out.startswith(prompt) or not out.endswith("\n"):
        raise HarnessError(f"loom generate printed {out[:200]!r}, not the prompt then a continuation")
    match = _TIMING.search(done.stderr)
    if match is None:
        raise HarnessError(f"no decode timing line in loom generate's stderr: {done.stderr[-1000:]}")
    return LocalGeneration(text=out[len(prompt):-1], decode_tokens=int(match.group(1)),
                           decode_seconds=float(match.group(2)),
                           decode_tokens_per_s=float(match.group(3)))


def tokenize(text: str, model: pathlib.Path = MODEL_PATH) -> list[int]:
    """`loom tokenize` (special tokens added as the coordinator adds them)."""
    done = subprocess.run([str(LOOM_BIN), "tokenize", "--model", str(model), text],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise HarnessError(f"loom tokenize exited with {done.returncode}: {done.stderr[-1000:]}")
    return [int(t) for t in done.stdout.split()]


# ---------------------------------------------------------------------------------------------
# Prompts: plain text (no special-token syntax), from 3 to ~190 tokens of SmolLM2's tokenizer.

LONG_PARAGRAPH = (
    "A serving cluster keeps one coordinator and many workers. The coordinator owns every "
    "scheduling decision and every block of the key and value cache; the workers own the weights "
    "and run the arithmetic. Each step, the coordinator decides which sequences run, how many "
    "tokens each of them computes, and which blocks hold their keys and values. It sends only "
    "what changed since the previous step, so the bytes on the wire do not grow with the length "
    "of the context. The workers answer with the sampled tokens, and the coordinator appends "
    "them, checks the stop conditions and streams the new text to the clients. When the cache "
    "runs out of blocks, the latest sequence of the lowest priority is preempted and computed "
    "again later, so that every request still completes. Summarize this in one sentence:")

TEXT_PROMPTS = (
    "Hello",
    "The capital of France is",
    "Write a haiku about the sea.",
    "List three colors:",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "She said that they would come to the station at seven, but the train was late, and",
    "In the beginning there was the word, and the word was with the machine, and it was good. "
    "The cache keeps the keys and the values of every token that the model has already seen, so",
    LONG_PARAGRAPH,
)


def post_json(url: str, body, timeout: float = 120) -> tuple[int, dict]:
    """(HTTP status, parsed JSON body) of a JSON POST; an error status is returned, not raised."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
