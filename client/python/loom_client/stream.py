"""A streaming Generate call as an iterator of chunks."""
from __future__ import annotations

import threading
import time
from typing import Optional

import grpc

from loom_client.errors import LoomError
from loom_client.types import Chunk


class GenerateStream:
    """Iterates over the chunks of one Generate call; the last has `finish_reason` set.

    Until the first chunk arrives, a call that fails with UNAVAILABLE is made again after a
    backoff (within the deadline), on the leader a standby coordinator named or the client's
    next address; once a chunk arrived, every error is raised as LoomError.
    close() (or leaving a `with` block, or garbage collection) cancels the call, which frees
    its KV blocks on the server. close() may be called from any thread.
    """

    def __init__(self, endpoints, request, deadline: Optional[float], retry, metadata: tuple = ()):
        self._endpoints = endpoints  # the coordinators (loom_client.endpoints)
        self._metadata = metadata  # sent with every attempt (the API key)
        self._request = request
        self._deadline = deadline  # time.monotonic() value, None for no deadline
        self._retry = retry
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._call = None
        self._received_any = False
        self._finished = False
        self._done = False
        self.attempts = 0

    def __iter__(self) -> "GenerateStream":
        return self

    def __next__(self) -> Chunk:
        while not self._done:
            call = self._call or self._start()
            try:
                message = next(call)
            except StopIteration:
                self._done = True
                if not self._finished:
                    raise LoomError(grpc.StatusCode.INTERNAL, "the Generate stream ended without a finish reason",
                                    self.attempts) from None
                break
            except grpc.RpcError as error:
                self._call = None
                if self._may_retry(error) and self._backoff():
                    self._endpoints.turn(error)  # a standby names the leader
                    continue
                self._done = True
                raise LoomError.from_rpc_error(error, self.attempts) from None
            self._received_any = True
            chunk = Chunk.from_proto(message)
            self._finished = chunk.finish_reason is not None
            return chunk
        raise StopIteration

    def _start(self):
        with self._lock:
            if self._closed.is_set():
                self._done = True
                raise LoomError(grpc.StatusCode.CANCELLED, "the client closed the stream", self.attempts)
            timeout = None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)
            self._call = self._endpoints.stub().Generate(self._request, timeout=timeout, metadata=self._metadata)
            self.attempts += 1
            return self._call

    def _may_retry(self, error: grpc.RpcError) -> bool:
        # Tokens already seen cannot be taken back: retry only before the first message.
        return (not self._received_any and error.code() == grpc.StatusCode.UNAVAILABLE
                and not self._closed.is_set() and self.attempts < self._retry.max_attempts)

    def _backoff(self) -> bool:
        """Waits before the next attempt; False when past the deadline or closed meanwhile."""
        wait = self._retry.backoff(self.attempts)
        if self._deadline is not None and time.monotonic() + wait >= self._deadline:
            return False
        return not self._closed.wait(wait)

    def close(self) -> None:
        """Cancels the call (idempotent)."""
        with self._lock:
            self._closed.set()
            if self._call is not None and not self._done:
                self._call.cancel()

    cancel = close

    def __enter__(self) -> "GenerateStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
