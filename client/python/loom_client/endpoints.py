"""Which coordinator a client calls: one address, or a leader and its standbys."""
from __future__ import annotations

import threading
from typing import Callable

import grpc

from loom_client._proto.loom.v1 import inference_pb2_grpc as pb_grpc


def _named_leader(error: grpc.RpcError) -> str:
    """The leader a standby coordinator named in its refusal (metadata `loom-leader`)."""
    try:
        metadata = error.trailing_metadata() or ()
    except Exception:  # an error raised before the call had any metadata
        return ""
    for key, value in metadata:
        if key == "loom-leader":
            return value.decode() if isinstance(value, bytes) else value
    return ""


class Endpoints:
    """The coordinators a client may call (`addresses`: "host:port", or several separated by
    commas: coordinators of one cluster, one leading). Calls go to the current one. After a
    call fails with UNAVAILABLE (`turn`), the next goes to the leader the coordinator named
    (a standby refuses with the leader's address), else to the next address of the list: a
    client keeps working through a failover without a load balancer in front. Channels are
    opened on first use and kept. Thread-safe."""

    def __init__(self, addresses: str, connect: Callable[[str], object]):
        self.addresses = [a.strip() for a in addresses.split(",") if a.strip()]
        if not self.addresses:
            raise ValueError(f"no coordinator address in {addresses!r}")
        self._connect = connect
        self._lock = threading.Lock()
        self._current = self.addresses[0]
        self._stubs: dict[str, tuple[object, pb_grpc.InferenceStub]] = {}

    @property
    def current(self) -> str:
        with self._lock:
            return self._current

    def stub(self) -> pb_grpc.InferenceStub:
        """The current coordinator's Inference stub."""
        with self._lock:
            if self._current not in self._stubs:
                channel = self._connect(self._current)
                self._stubs[self._current] = (channel, pb_grpc.InferenceStub(channel))
            return self._stubs[self._current][1]

    def turn(self, error: grpc.RpcError) -> None:
        """After `error` (retried): turns to the leader it names, else to the next address."""
        if error.code() != grpc.StatusCode.UNAVAILABLE:
            return
        leader = _named_leader(error)
        with self._lock:
            if leader:
                self._current = leader
            elif len(self.addresses) > 1:
                at = self.addresses.index(self._current) if self._current in self.addresses else -1
                self._current = self.addresses[(at + 1) % len(self.addresses)]

    def channels(self) -> list:
        with self._lock:
            return [channel for channel, _ in self._stubs.values()]
