"""The one exception the client raises for a failed call."""
from __future__ import annotations

import grpc


class LoomError(Exception):
    """A call that failed: `code` is the gRPC status code (grpc.StatusCode), `details` the
    server's message, `attempts` how many calls were made (retries of UNAVAILABLE included)."""

    def __init__(self, code: grpc.StatusCode, details: str, attempts: int = 1):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.attempts = attempts

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError, attempts: int = 1) -> "LoomError":
        return cls(error.code(), error.details() or "", attempts)
