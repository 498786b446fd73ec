"""LoomClient: a typed wrapper over the loom.v1.Inference stub."""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Callable, Optional, Sequence, Union

import grpc

from loom_client._proto.loom.v1 import inference_pb2 as pb
from loom_client._proto.loom.v1 import worker_pb2 as wpb
from loom_client.endpoints import Endpoints
from loom_client.errors import LoomError
from loom_client.stream import GenerateStream
from loom_client.types import Chunk, ClusterState, Completion, Embeddings, ModelCard

Prompt = Union[str, Sequence[int]]


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Calls that fail with UNAVAILABLE before any output are made again, at most
    `max_attempts` calls in all, waiting initial_backoff * multiplier**(n-1) seconds (at most
    max_backoff) before retry n, never past the call's deadline."""
    max_attempts: int = 5
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    multiplier: float = 2.0

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1 is the first)."""
        return min(self.max_backoff, self.initial_backoff * self.multiplier ** max(retry - 1, 0))


def _connect(grpc_module, address: str, tls: bool, root_certs_path: Optional[str],
             channel_options: Sequence[tuple], api_key: Optional[str]):
    """(endpoints, call metadata) of a client: `grpc_module` is grpc or grpc.aio. The API key
    (LOOM_API_KEY when None) goes with every call as `authorization: Bearer <key>`."""
    # Retries are the client's own (before the first message only, counted, within the
    # deadline); gRPC's built-in ones would add more.
    options = [("grpc.enable_retries", 0), *channel_options]
    roots = open(root_certs_path, "rb").read() if tls and root_certs_path else None

    def channel(target: str):
        if tls:
            return grpc_module.secure_channel(target, grpc.ssl_channel_credentials(roots), options)
        return grpc_module.insecure_channel(target, options)

    if api_key is None:
        api_key = os.environ.get("LOOM_API_KEY") or None
    return Endpoints(address, channel), (("authorization", f"Bearer {api_key}"),) if api_key else ()


class _ClientBase:
    """What the blocking and asyncio clients share: the channel (`grpc_module` is grpc or
    grpc.aio), the stub, the API-key metadata, the default deadline and the retry policy."""

    def __init__(self, grpc_module, address: str = "127.0.0.1:50051", *, tls: bool = False,
                 root_certs_path: Optional[str] = None, timeout: Optional[float] = None,
                 retry: RetryPolicy = RetryPolicy(), channel_options: Sequence[tuple] = (),
                 api_key: Optional[str] = None):
        if retry.max_attempts < 1:
            raise ValueError(f"retry.max_attempts must be >= 1, not {retry.max_attempts}")
        self._endpoints, self._metadata = _connect(grpc_module, address, tls, root_certs_path,
                                                   channel_options, api_key)
        self.address = address
        self.timeout = timeout
        self.retry = retry

    def _deadline(self, timeout: Optional[float]) -> Optional[float]:
        timeout = self.timeout if timeout is None else timeout
        return None if timeout is None else time.monotonic() + timeout

    def _retry_wait(self, error: grpc.RpcError, attempt: int, deadline: Optional[float]) -> float:
        """Seconds to wait before retrying a unary call that failed with `error` on attempt
        `attempt`; raises it as LoomError when it is not retried (not UNAVAILABLE, out of
        attempts, or the wait would pass the deadline)."""
        wait = self.retry.backoff(attempt)
        if (error.code() != grpc.StatusCode.UNAVAILABLE or attempt >= self.retry.max_attempts
                or (deadline is not None and time.monotonic() + wait >= deadline)):
            raise LoomError.from_rpc_error(error, attempt) from None
        self._endpoints.turn(error)
        return wait


_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                    "frequency_penalty", "seed", "min_tokens")


class LoomClient(_ClientBase):
    """A connection to a Loom coordinator (`loom up` / `loom serve`). Thread-safe.

    address: host:port of the gRPC endpoint, or several separated by commas (a leader and
    its standby coordinators: a call refused by a standby, or whose coordinator went away
    before it started, is retried on the leader the standby names, else on the next one).
    tls: use TLS, with the CA certificates of
    `root_certs_path` (PEM) or gRPC's default roots. timeout: the default deadline of every
    call in seconds (None: none). api_key: the coordinator's key (`loom serve --api-key`),
    sent with every call as metadata `authorization: Bearer <api_key>` (None: the
    LOOM_API_KEY environment variable, if set). Errors are raised as LoomError(code, details):
    UNAUTHENTICATED for a missing or wrong key.
    """

    def __init__(self, address: str = "127.0.0.1:50051", **options):
        super().__init__(grpc, address, **options)

    def close(self) -> None:
        for channel in self._endpoints.channels():
            channel.close()

    def __enter__(self) -> "LoomClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- generation ------------------------------------------------------------------------

    def generate_stream(self, prompt: Prompt, *, max_tokens: int = 0, timeout: Optional[float] = None,
                        **params) -> GenerateStream:
        """Starts a Generate call and returns its chunks as an iterator (see GenerateStream).

        prompt: text (tokenized by the server, special tokens parsed) or token ids.
        max_tokens: 0 for up to the context length. params: temperature, top_k, top_p, min_p,
        repetition_penalty, presence_penalty, frequency_penalty, seed, logprobs (None: none,
        0: the chosen token's, n: and the n most likely), stop, stop_token_ids, ignore_eos,
        priority, request_id, model, cache_salt, logit_bias ({token id: bias in [-100, 100]}),
        min_tokens (EOS and stop tokens masked until then), include_stop_str_in_output,
        skip_special_tokens (default True), prompt_logprobs (each prompt token's logprob,
        rank and the n most likely tokens, on the last chunk); structured output (one of): json_schema (a
        dict or JSON text), json_object=True, regex, choice (a list of strings), grammar (GBNF).
        """
        request = _generate_request(prompt, max_tokens, **params)
        return GenerateStream(self._endpoints, request, self._deadline(timeout), self.retry, self._metadata)

    def generate(self, prompt: Prompt, *, max_tokens: int = 0, timeout: Optional[float] = None,
                 on_chunk: Optional[Callable[[Chunk], None]] = None, **params) -> Completion:
        """Generates one completion and returns it whole (arguments as generate_stream)."""
        return _collect(self.generate_stream(prompt, max_tokens=max_tokens, timeout=timeout,
                                             **params), on_chunk)

    def chat_stream(self, messages: Sequence[dict], *, tools: Optional[Sequence[dict]] = None,
                    tool_choice=None, parallel_tool_calls: Optional[bool] = None,
                    add_generation_prompt: Optional[bool] = None,
                    continue_final_message: bool = False,
                    chat_template_kwargs: Optional[dict] = None,
                    reasoning_effort: Optional[str] = None,
                    max_tokens: int = 0, timeout: Optional[float] = None, **params) -> GenerateStream:
        """Streams a chat: `messages` (OpenAI's: role, content, name, tool_call_id,
        tool_calls) rendered by the served model's chat template, as /v1/chat/completions
        renders them. tools: OpenAI's [{"type": "function", "function": {"name",
        "description", "parameters"}}] or the bare function dicts. tool_choice: "auto"
        (default with tools), "none", "required", a function's name, or OpenAI's
        {"type": "function", "function": {"name": ...}}; "required" and a named function
        are enforced by the server's grammar engine. continue_final_message (with
        add_generation_prompt=False) continues the last message, an assistant reply
        prefilled by the caller, instead of starting a new one (vLLM's fields).
        chat_template_kwargs: further variables of the template (vLLM's, e.g.
        {"enable_thinking": False}); reasoning_effort: OpenAI's ("minimal", "low",
        "medium", "high"), the template's variable of that name.
        The last chunk carries `tool_calls`
        and `content`; chunk texts are the model's raw output. Other params as
        generate_stream."""
        request = _generate_request(None, max_tokens, **params)
        _set_chat(request, messages, tools, tool_choice, parallel_tool_calls, add_generation_prompt,
                  continue_final_message, chat_template_kwargs, reasoning_effort)
        return GenerateStream(self._endpoints, request, self._deadline(timeout), self.retry,
                              self._metadata)

    def chat(self, messages: Sequence[dict], *, timeout: Optional[float] = None,
             on_chunk: Optional[Callable[[Chunk], None]] = None, **params) -> Completion:
        """A chat's whole reply (arguments as chat_stream): `tool_calls` holds the calls
        the model made (ToolCall: id, name, arguments JSON text), `content` the rest."""
        return _collect(self.chat_stream(messages, timeout=timeout, **params), on_chunk)

    # -- unary calls -------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special_tokens: bool = True, parse_special: bool = True,
                 timeout: Optional[float] = None) -> list[int]:
        request = pb.TokenizeRequest(text=text, add_special_tokens=add_special_tokens,
                                     parse_special=parse_special)
        return list(self._unary("Tokenize", request, timeout).token_ids)

    def embed(self, inputs: Union[Prompt, Sequence[Prompt]], *,
              timeout: Optional[float] = None) -> Embeddings:
        """Embeddings of a text, a token-id list, or a list of either (one vector each)."""
        return Embeddings.from_proto(self._unary("Embed", _embed_request(inputs), timeout))

    def detokenize(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False,
                   timeout: Optional[float] = None) -> str:
        request = pb.DetokenizeRequest(token_ids=list(token_ids), skip_special_tokens=skip_special_tokens)
        return self._unary("Detokenize", request, timeout).text

    def list_models(self, *, timeout: Optional[float] = None) -> list[ModelCard]:
        response = self._unary("ListModels", pb.ListModelsRequest(), timeout)
        return [ModelCard.from_proto(m) for m in response.models]

    def cluster_state(self, *, timeout: Optional[float] = None) -> ClusterState:
        return ClusterState.from_proto(self._unary("GetClusterState", pb.GetClusterStateRequest(), timeout))

    def _unary(self, method, request, timeout: Optional[float]):
        deadline = self._deadline(timeout)
        attempt = 0
        while True:
            attempt += 1
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                return getattr(self._endpoints.stub(), method)(request, timeout=left,
                                                              metadata=self._metadata)
            except grpc.RpcError as error:
                time.sleep(self._retry_wait(error, attempt, deadline))


def _collect(stream: GenerateStream, on_chunk: Optional[Callable[[Chunk], None]]) -> Completion:
    """A stream's chunks joined into one Completion, each also given to `on_chunk`."""
    completion = Completion()
    with stream:
        for chunk in stream:
            completion.append(chunk)
            if on_chunk is not None:
                on_chunk(chunk)
        completion.attempts = stream.attempts
    return completion


def _grammar(json_schema, json_object: bool, regex: Optional[str], choice, grammar: Optional[str]):
    """The GrammarConstraint of the structured-output arguments, or None."""
    given = [(kind, text) for kind, text in (
        ("json_schema", None if json_schema is None else
         json_schema if isinstance(json_schema, str) else json.dumps(json_schema)),
        ("json_object", "" if json_object else None),
        ("regex", regex),
        ("choice", None if choice is None else json.dumps(list(choice))),
        ("grammar", grammar)) if text is not None]
    if len(given) > 1:
        raise TypeError(f"give at most one of json_schema, json_object, regex, choice, grammar; got "
                        f"{[kind for kind, _ in given]}")
    return wpb.GrammarConstraint(kind=given[0][0], text=given[0][1]) if given else None


def _generate_request(prompt: Prompt, max_tokens: int, *, logprobs: Optional[int] = None, stop=(),
                      stop_token_ids=(), ignore_eos: bool = False, priority: int = 0,
                      request_id: str = "", model: str = "", cache_salt: str = "",
                      json_schema=None, json_object: bool = False, regex: Optional[str] = None,
                      choice=None, grammar: Optional[str] = None, logit_bias=None,
                      include_stop_str_in_output: bool = False,
                      skip_special_tokens: Optional[bool] = None,
                      prompt_logprobs: Optional[int] = None, **sampling):
    unknown = set(sampling) - set(_SAMPLING_FIELDS)
    if unknown:
        raise TypeError(f"unknown generate parameters: {sorted(unknown)}")
    params = wpb.SamplingParams(**{k: v for k, v in sampling.items() if v is not None})
    if logprobs is not None:
        params.num_logprobs = logprobs
    for token_id, bias in (logit_bias or {}).items():
        params.logit_bias[int(token_id)] = float(bias)
    constraint = _grammar(json_schema, json_object, regex, choice, grammar)
    if constraint is not None:
        params.grammar.CopyFrom(constraint)
    if isinstance(stop, str):
        stop = [stop]
    request = pb.GenerateRequest(sampling=params, max_tokens=max_tokens, stop=list(stop),
                                 stop_token_ids=list(stop_token_ids), ignore_eos=ignore_eos,
                                 priority=priority, request_id=request_id, model=model,
                                 cache_salt=cache_salt,
                                 include_stop_str_in_output=include_stop_str_in_output)
    if skip_special_tokens is not None:
        request.skip_special_tokens = skip_special_tokens
    if prompt_logprobs is not None:
        request.prompt_logprobs = prompt_logprobs
    if prompt is None:
        pass  # a chat: _set_chat fills in the messages
    elif isinstance(prompt, str):
        request.text = prompt
    else:
        request.token_ids.SetInParent()  # an empty list still selects the token-id prompt
        request.token_ids.ids.extend(prompt)
    return request


def _embed_request(inputs) -> "pb.EmbedRequest":
    """A str or a list of ints is one input; any other sequence is a list of inputs."""
    if isinstance(inputs, str) or (isinstance(inputs, Sequence) and inputs
                                   and all(isinstance(i, int) for i in inputs)):
        inputs = [inputs]
    request = pb.EmbedRequest()
    for one in inputs:
        if isinstance(one, str):
            request.inputs.add(text=one)
        else:
            request.inputs.add(token_ids=pb.TokenIds(ids=list(one)))
    return request


def _json_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _set_chat(request, messages, tools, tool_choice, parallel_tool_calls, add_generation_prompt=None,
              continue_final_message=False, chat_template_kwargs=None, reasoning_effort=None) -> None:
    """Fills the chat fields of a GenerateRequest from OpenAI-shaped arguments."""
    for message in messages:
        out = request.messages.add(role=message["role"], name=message.get("name") or "",
                                   tool_call_id=message.get("tool_call_id") or "")
        content = message.get("content")
        if isinstance(content, list):  # content parts: their text joined
            content = "".join(part.get("text", "") for part in content)
        if content is not None:
            out.content = content
        for call in message.get("tool_calls") or ():
            function = call.get("function", call)
            arguments = function.get("arguments", "{}")
            out.tool_calls.add(id=call.get("id", ""), name=function["name"],
                               arguments=_json_text(arguments))
    for tool in tools or ():
        function = tool.get("function", tool)
        parameters = function.get("parameters")
        request.tools.add(name=function["name"], description=function.get("description") or "",
                          parameters="" if parameters is None else _json_text(parameters))
    if isinstance(tool_choice, dict):
        request.tool_choice = "function"
        request.tool_choice_function = tool_choice.get("function", tool_choice)["name"]
    elif tool_choice in ("auto", "none", "required"):
        request.tool_choice = tool_choice
    elif tool_choice is not None:  # a function's name
        request.tool_choice = "function"
        request.tool_choice_function = tool_choice
    if parallel_tool_calls is not None:
        request.parallel_tool_calls = parallel_tool_calls
    if add_generation_prompt is not None:
        request.add_generation_prompt = add_generation_prompt
    request.continue_final_message = continue_final_message
    if chat_template_kwargs is not None:
        request.chat_template_kwargs = _json_text(chat_template_kwargs)
    if reasoning_effort is not None:
        request.reasoning_effort = reasoning_effort
