"""Leader election through a Kubernetes Lease (`loom serve --leader-lease NAME`,
coordinator/kubernetes_lease), over real `loom serve` and `loom-worker` processes.

No Kubernetes API server can run here, so the test serves the part of it the election uses: a
Lease object under /apis/coordination.k8s.io/v1/namespaces/NS/leases with the API server's
semantics (GET 404 until created, POST 409 when it exists, PUT 409 unless the body carries the
current resourceVersion, a new resourceVersion on every write, 401 without the service
account's bearer token). The coordinators reach it through LOOM_KUBERNETES_API_SERVER (as they
would `kubectl proxy`) and read the token and namespace from a service-account directory.

* The first coordinator creates the Lease and leads; the second follows (its /ready is 503
  "follower" naming the leader's address from the Lease's annotation) and the worker, which
  lists the follower first, is sent to the leader.
* A leader stopped with SIGTERM (a rolling update) releases the Lease: the follower takes it
  at its next look, well within the lease duration, and the worker follows it there.
* Each coordinator labels its pod `loom.dev/role: follower`, and the leader `leader` (a merge
  patch), so that the clients' Service selects the leader alone.
* A leader that dies (SIGKILL) stops renewing: a follower takes the Lease once it has not
  changed for the lease duration (4 s) on the follower's own clock, and never before.
"""
import copy
import http.server
import json
import pathlib
import sys
import threading
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
import cluster_harness as h  # noqa: E402

TOKEN = "s3rvice-account-t0ken"
NAMESPACE = "loom-test"
LEASE = "loom-coordinator"
LEASE_DURATION_S = 4
TIMEOUT_S = 60


class FakeLeaseApi(http.server.ThreadingHTTPServer):
    """The Lease resource of a Kubernetes API server, in memory."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), LeaseHandler)
        self.lock = threading.Lock()
        self.leases = {}
        self.version = 0
        self.writes = []  # (time, holderIdentity) of every successful write
        self.pod_roles = {}  # pod name -> its loom.dev/role label
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    def lease(self, name):
        with self.lock:
            return copy.deepcopy(self.leases.get(name))


class LeaseHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def route(self):
        """The Lease's name (None: the collection); False when answered already."""
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.reply(401, {"kind": "Status", "code": 401})
            return False
        parts = self.path.strip("/").split("/")
        if parts[:5] != ["apis", "coordination.k8s.io", "v1", "namespaces", NAMESPACE] or \
                len(parts) < 6 or parts[5] != "leases":
            self.reply(404, {"kind": "Status", "code": 404})
            return False
        return parts[6] if len(parts) > 6 else None

    def body(self):
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def store(self, name, lease):
        server = self.server
        server.version += 1
        lease["metadata"]["resourceVersion"] = str(server.version)
        server.leases[name] = lease
        server.writes.append((time.monotonic(), lease["spec"].get("holderIdentity", "")))
        return copy.deepcopy(lease)

    def do_GET(self):
        name = self.route()
        if name is False:
            return
        lease = self.server.lease(name)
        if lease is None:
            return self.reply(404, {"kind": "Status", "code": 404})
        self.reply(200, lease)

    def do_POST(self):
        if self.route() is False:
            return
        lease = self.body()
        name = lease["metadata"]["name"]
        with self.server.lock:
            if name in self.server.leases:
                return self.reply(409, {"kind": "Status", "code": 409, "reason": "AlreadyExists"})
            stored = self.store(name, lease)
        self.reply(201, stored)

    def do_PATCH(self):
        """A merge patch of a pod's labels (the only pod change the coordinators make)."""
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self.reply(401, {"kind": "Status", "code": 401})
        parts = self.path.strip("/").split("/")
        if parts[:4] != ["api", "v1", "namespaces", NAMESPACE] or len(parts) != 6 or \
                parts[4] != "pods" or \
                self.headers.get("Content-Type") != "application/merge-patch+json":
            return self.reply(404, {"kind": "Status", "code": 404})
        labels = self.body()["metadata"]["labels"]
        with self.server.lock:
            self.server.pod_roles[parts[5]] = labels["loom.dev/role"]
        self.reply(200, {"kind": "Pod", "metadata": {"name": parts[5], "labels": labels}})

    def do_PUT(self):
        name = self.route()
        if name is False:
            return
        lease = self.body()
        with self.server.lock:
            current = self.server.leases.get(name)
            if current is None:
                return self.reply(404, {"kind": "Status", "code": 404})
            if lease["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                return self.reply(409, {"kind": "Status", "code": 409, "reason": "Conflict"})
            stored = self.store(name, lease)
        self.reply(200, stored)


def holder(api):
    lease = api.lease(LEASE)
    return lease["spec"]["holderIdentity"] if lease else None


@pytest.fixture
def api(tmp_path, monkeypatch):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(TOKEN + "\n")
    (account / "namespace").write_text(NAMESPACE)
    server = FakeLeaseApi()
    monkeypatch.setenv("LOOM_KUBERNETES_API_SERVER", server.url)
    monkeypatch.setenv("LOOM_KUBERNETES_SERVICEACCOUNT_DIR", str(account))
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    yield server
    server.shutdown()


def test_one_leads_a_released_lease_passes_at_once_a_dead_leaders_after_its_duration(
        api, tmp_path, monkeypatch):
    processes = []

    def coordinator(pod):
        monkeypatch.setenv("POD_NAME", pod)
        process = h.Coordinator(tmp_path, name=f"coordinator-{pod}", leader_lease=LEASE)
        processes.append(process)
        return process

    try:
        a = coordinator("a")
        a.wait_for_line(r"loom: leading", TIMEOUT_S)
        assert holder(api) == "a"
        assert api.lease(LEASE)["metadata"]["annotations"]["loom.dev/leader-address"] == a.address
        followers = {"b": coordinator("b"), "c": coordinator("c")}
        for follower in followers.values():
            follower.wait_for_line(r"loom: leader election", TIMEOUT_S)
        everyone = {"a": a, **followers}
        worker = h.Worker(tmp_path, ",".join(everyone[p].address for p in "bca"), "replica-a",
                          step_backend="noop", threads=1, kv_cache_memory="1GiB")
        processes.append(worker)
        worker_pid = worker.pid
        a.wait_healthy(["replica-a"], timeout=TIMEOUT_S)
        for follower in followers.values():
            status, body = h.http_ready(follower)
            assert status == 503 and body == {"status": "follower", "leader": a.address}, body
        # The clients' Service selects the leader's pod by its label.
        assert api.pod_roles == {"a": "leader", "b": "follower", "c": "follower"}
        time.sleep(2.5)  # renewals go on: no follower takes over
        assert holder(api) == "a"

        # A rolling update: SIGTERM releases the Lease, a follower takes it at its next look.
        stopped_at = time.monotonic()
        assert a.stop(timeout=TIMEOUT_S) == 0
        assert h.wait_until(lambda: holder(api) in ("b", "c"), TIMEOUT_S)
        second = holder(api)
        leader = everyone[second]
        leader.wait_healthy(["replica-a"], timeout=TIMEOUT_S)
        handover_s = time.monotonic() - stopped_at
        print(f"released lease: {second} leads and serves {handover_s:.2f} s after SIGTERM")
        # Released, not expired: a's last write gave the Lease up, and the next one took it.
        holders = [who for _, who in api.writes]
        released = len(holders) - 1 - holders[::-1].index("")
        assert holders[released - 1] == "a" and holders[released + 1] == second, holders
        assert h.wait_until(lambda: api.pod_roles[second] == "leader", TIMEOUT_S)
        # The old leader resigned before it drained: its pod left the clients' Service.
        assert api.pod_roles["a"] == "follower"
        assert "handing leadership over" in a.log_path.read_text()
        assert h.generate(leader.stub, h.make_request("Hello", max_tokens=4),
                          timeout=TIMEOUT_S).finished

        # A crash: the Lease passes once it has been left alone for its duration.
        third = "c" if second == "b" else "b"
        killed_at = time.monotonic()
        leader.kill()
        everyone[third].wait_healthy(["replica-a"], timeout=TIMEOUT_S)
        takeover_s = time.monotonic() - killed_at
        last_renewal = max(t for t, who in api.writes if who == second)
        taken = min(t for t, who in api.writes if who == third)
        print(f"dead leader: {third} took the lease {taken - last_renewal:.2f} s after the last "
              f"renewal and serves {takeover_s:.2f} s after the SIGKILL")
        assert taken - last_renewal >= LEASE_DURATION_S - 0.05
        assert h.generate(everyone[third].stub, h.make_request("Hello", max_tokens=4),
                          timeout=TIMEOUT_S).finished
        assert worker.alive() and worker.pid == worker_pid
    finally:
        for process in reversed(processes):
            process.stop(timeout=5)
        for process in processes:
            print(process.log_tail())
