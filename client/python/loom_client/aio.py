"""AsyncLoomClient: LoomClient for asyncio, over grpc.aio."""
from __future__ import annotations

import asyncio
import time
from typing import Callable, Optional, Sequence

import grpc
import grpc.aio

from loom_client._proto.loom.v1 import inference_pb2 as pb
from loom_client.client import (Prompt, RetryPolicy, _ClientBase, _embed_request, _generate_request,
                                _set_chat)
from loom_client.errors import LoomError
from loom_client.types import Chunk, ClusterState, Completion, Embeddings, ModelCard


class AsyncGenerateStream:
    """The chunks of one Generate call as an async iterator; the last has `finish_reason`.

    As GenerateStream: until the first chunk arrives, UNAVAILABLE is retried after a backoff
    (within the deadline); afterwards every error is raised as LoomError. close() (or leaving
    an `async with` block) cancels the call, which frees its KV blocks on the server.
    """

    def __init__(self, endpoints, request, deadline: Optional[float], retry: RetryPolicy,
                 metadata: tuple = ()):
        self._endpoints = endpoints  # the coordinators (loom_client.endpoints)
        self._request = request
        self._deadline = deadline  # time.monotonic() value, None for no deadline
        self._retry = retry
        self._metadata = metadata
        self._call = None
        self._closed = False
        self._received_any = False
        self._finished = False
        self._done = False
        self.attempts = 0

    def __aiter__(self) -> "AsyncGenerateStream":
        return self

    async def __anext__(self) -> Chunk:
        while not self._done:
            if self._closed:
                self._done = True
                raise LoomError(grpc.StatusCode.CANCELLED, "the client closed the stream",
                                self.attempts)
            if self._call is None:
                self._start()
            try:
                message = await self._call.read()
            except asyncio.CancelledError:
                if not self._closed:
                    raise  # the awaiting task itself was cancelled
                continue  # close() cancelled the call: answered above
            except grpc.RpcError as error:
                self._call = None
                if self._may_retry(error) and await self._backoff():
                    self._endpoints.turn(error)  # a standby names the leader
                    continue
                self._done = True
                raise LoomError.from_rpc_error(error, self.attempts) from None
            if message is grpc.aio.EOF:
                self._done = True
                if not self._finished:
                    raise LoomError(grpc.StatusCode.INTERNAL,
                                    "the Generate stream ended without a finish reason",
                                    self.attempts)
                break
            self._received_any = True
            chunk = Chunk.from_proto(message)
            self._finished = chunk.finish_reason is not None
            return chunk
        raise StopAsyncIteration

    def _start(self) -> None:
        if self._closed:
            self._done = True
            raise LoomError(grpc.StatusCode.CANCELLED, "the client closed the stream", self.attempts)
        timeout = None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)
        self._call = self._endpoints.stub().Generate(self._request, timeout=timeout, metadata=self._metadata)
        self.attempts += 1

    def _may_retry(self, error: grpc.RpcError) -> bool:
        # Tokens already seen cannot be taken back: retry only before the first message.
        return (not self._received_any and error.code() == grpc.StatusCode.UNAVAILABLE
                and not self._closed and self.attempts < self._retry.max_attempts)

    async def _backoff(self) -> bool:
        """Waits before the next attempt; False when that would pass the deadline."""
        wait = self._retry.backoff(self.attempts)
        if self._deadline is not None and time.monotonic() + wait >= self._deadline:
            return False
        await asyncio.sleep(wait)
        return not self._closed

    def close(self) -> None:
        """Cancels the call (idempotent)."""
        self._closed = True
        if self._call is not None and not self._done:
            self._call.cancel()

    cancel = close

    async def __aenter__(self) -> "AsyncGenerateStream":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()


class AsyncLoomClient(_ClientBase):
    """LoomClient's calls as coroutines, on one grpc.aio channel: the same arguments,
    results, errors (LoomError), retries and API key. Use it from one event loop; close it
    with `await client.close()` or `async with`."""

    def __init__(self, address: str = "127.0.0.1:50051", **options):
        super().__init__(grpc.aio, address, **options)

    async def close(self) -> None:
        for channel in self._endpoints.channels():
            await channel.close()

    async def __aenter__(self) -> "AsyncLoomClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- generation ------------------------------------------------------------------------

    def generate_stream(self, prompt: Prompt, *, max_tokens: int = 0,
                        timeout: Optional[float] = None, **params) -> AsyncGenerateStream:
        """Starts a Generate call (LoomClient.generate_stream's arguments); its chunks come
        from `async for`."""
        request = _generate_request(prompt, max_tokens, **params)
        return AsyncGenerateStream(self._endpoints, request, self._deadline(timeout), self.retry,
                                   self._metadata)

    async def generate(self, prompt: Prompt, *, max_tokens: int = 0,
                       timeout: Optional[float] = None,
                       on_chunk: Optional[Callable[[Chunk], None]] = None, **params) -> Completion:
        """One completion, whole (arguments as generate_stream)."""
        return await _collect(self.generate_stream(prompt, max_tokens=max_tokens, timeout=timeout,
                                                   **params), on_chunk)

    def chat_stream(self, messages: Sequence[dict], *, tools: Optional[Sequence[dict]] = None,
                    tool_choice=None, parallel_tool_calls: Optional[bool] = None,
                    add_generation_prompt: Optional[bool] = None,
                    continue_final_message: bool = False,
                    chat_template_kwargs: Optional[dict] = None,
                    reasoning_effort: Optional[str] = None,
                    max_tokens: int = 0, timeout: Optional[float] = None,
                    **params) -> AsyncGenerateStream:
        """A chat, streamed (LoomClient.chat_stream's arguments)."""
        request = _generate_request(None, max_tokens, **params)
        _set_chat(request, messages, tools, tool_choice, parallel_tool_calls, add_generation_prompt,
                  continue_final_message, chat_template_kwargs, reasoning_effort)
        return AsyncGenerateStream(self._endpoints, request, self._deadline(timeout), self.retry,
                                   self._metadata)

    async def chat(self, messages: Sequence[dict], *, timeout: Optional[float] = None,
                   on_chunk: Optional[Callable[[Chunk], None]] = None, **params) -> Completion:
        """A chat's whole reply, tool calls included (arguments as chat_stream)."""
        return await _collect(self.chat_stream(messages, timeout=timeout, **params), on_chunk)

    # -- unary calls -------------------------------------------------------------------------

    async def tokenize(self, text: str, *, add_special_tokens: bool = True,
                       parse_special: bool = True, timeout: Optional[float] = None) -> list[int]:
        request = pb.TokenizeRequest(text=text, add_special_tokens=add_special_tokens,
                                     parse_special=parse_special)
        return list((await self._unary("Tokenize", request, timeout)).token_ids)

    async def embed(self, inputs, *, timeout: Optional[float] = None) -> Embeddings:
        """Embeddings of a text, a token-id list, or a list of either (one vector each)."""
        return Embeddings.from_proto(
            await self._unary("Embed", _embed_request(inputs), timeout))

    async def detokenize(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False,
                         timeout: Optional[float] = None) -> str:
        request = pb.DetokenizeRequest(token_ids=list(token_ids),
                                       skip_special_tokens=skip_special_tokens)
        return (await self._unary("Detokenize", request, timeout)).text

    async def list_models(self, *, timeout: Optional[float] = None) -> list[ModelCard]:
        response = await self._unary("ListModels", pb.ListModelsRequest(), timeout)
        return [ModelCard.from_proto(m) for m in response.models]

    async def cluster_state(self, *, timeout: Optional[float] = None) -> ClusterState:
        return ClusterState.from_proto(
            await self._unary("GetClusterState", pb.GetClusterStateRequest(), timeout))

    async def _unary(self, method, request, timeout: Optional[float]):
        deadline = self._deadline(timeout)
        attempt = 0
        while True:
            attempt += 1
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                return await getattr(self._endpoints.stub(), method)(request, timeout=left,
                                                                     metadata=self._metadata)
            except grpc.RpcError as error:
                await asyncio.sleep(self._retry_wait(error, attempt, deadline))


async def _collect(stream: AsyncGenerateStream,
                   on_chunk: Optional[Callable[[Chunk], None]]) -> Completion:
    completion = Completion()
    async with stream:
        async for chunk in stream:
            completion.append(chunk)
            if on_chunk is not None:
                on_chunk(chunk)
        completion.attempts = stream.attempts
    return completion
