"""Plain results of the client (dataclasses), converted from the loom.v1 messages."""
from __future__ import annotations

import dataclasses
import json
from typing import Optional

from loom_client._proto.loom.v1 import inference_pb2 as pb

_FINISH_REASONS = {
    pb.FINISH_REASON_STOP: "stop",      # EOS, a stop token or a stop string
    pb.FINISH_REASON_LENGTH: "length",  # max_tokens or the context length
    pb.FINISH_REASON_ABORT: "abort",    # cancelled or the coordinator shut down
    pb.FINISH_REASON_ERROR: "error",    # a worker failed after output had started
}


@dataclasses.dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # most likely first


@dataclasses.dataclass
class PromptTokenLogprob:
    """One prompt token's score (generate(..., prompt_logprobs=n))."""
    token_id: int
    logprob: float  # given the prompt before it
    rank: int       # 1 + the tokens more likely than it
    top: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # most likely first


@dataclasses.dataclass
class ToolCall:
    """A function call the model made in a chat (LoomClient.chat)."""
    id: str
    name: str
    arguments: str  # JSON text of an object

    def parsed_arguments(self) -> dict:
        return json.loads(self.arguments)


@dataclasses.dataclass
class Chunk:
    """One streamed message: the output since the previous one. The last chunk has
    `finish_reason` set and carries the token counts."""
    request_id: str
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob]
    finish_reason: Optional[str]   # None until the last chunk
    error_message: str
    replica_id: str
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    # A chat with tools, last chunk: the calls parsed out of the whole reply, and the
    # reply's text outside them (`text` is the model's raw output).
    tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
    content: str = ""
    # A chat's reasoning, last chunk (gpt-oss's analysis channel, or the <think> part under
    # the server's --reasoning-parser); None when there was none.
    reasoning_content: Optional[str] = None
    # prompt_logprobs, last chunk: one per prompt token from the second on.
    prompt_logprobs: list[PromptTokenLogprob] = dataclasses.field(default_factory=list)

    @classmethod
    def from_proto(cls, message) -> "Chunk":
        return cls(
            request_id=message.request_id, text=message.text, token_ids=list(message.token_ids),
            logprobs=[TokenLogprob(o.token_id, o.logprob, [(t.token_id, t.logprob) for t in o.top_logprobs])
                      for o in message.logprobs],
            finish_reason=_FINISH_REASONS.get(message.finish_reason),
            error_message=message.error_message, replica_id=message.replica_id,
            prompt_tokens=message.prompt_tokens, completion_tokens=message.completion_tokens,
            cached_prompt_tokens=message.cached_prompt_tokens,
            tool_calls=[ToolCall(c.id, c.name, c.arguments) for c in message.tool_calls],
            content=message.content,
            reasoning_content=message.reasoning_content if message.HasField("reasoning_content") else None,
            prompt_logprobs=[PromptTokenLogprob(p.token_id, p.logprob, p.rank,
                                                [(t.token_id, t.logprob) for t in p.top_logprobs])
                             for p in message.prompt_logprobs])


@dataclasses.dataclass
class Completion:
    """A whole generation: every chunk joined."""
    request_id: str = ""
    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[TokenLogprob] = dataclasses.field(default_factory=list)
    finish_reason: Optional[str] = None
    error_message: str = ""
    replica_id: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    attempts: int = 0  # calls made, retries of UNAVAILABLE included
    tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)  # chat with tools
    content: str = ""  # chat with tools: the reply's text outside the calls
    reasoning_content: Optional[str] = None  # a chat's reasoning, when it had some
    prompt_logprobs: list[PromptTokenLogprob] = dataclasses.field(default_factory=list)

    def append(self, chunk: Chunk) -> None:
        self.request_id = self.request_id or chunk.request_id
        self.replica_id = self.replica_id or chunk.replica_id
        self.text += chunk.text
        self.token_ids.extend(chunk.token_ids)
        self.logprobs.extend(chunk.logprobs)
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
            self.error_message = chunk.error_message
            self.prompt_tokens = chunk.prompt_tokens
            self.completion_tokens = chunk.completion_tokens
            self.cached_prompt_tokens = chunk.cached_prompt_tokens
            self.tool_calls = list(chunk.tool_calls)
            self.content = chunk.content
            self.reasoning_content = chunk.reasoning_content
            self.prompt_logprobs = list(chunk.prompt_logprobs)


@dataclasses.dataclass
class Embeddings:
    """Embed's answer: one vector per input, in input order (each the input's last token's
    final hidden state, L2-normalized, as POST /v1/embeddings computes it)."""
    vectors: list[list[float]]
    input_tokens: list[int]   # each input's token count
    prompt_tokens: int        # their sum

    @classmethod
    def from_proto(cls, response) -> "Embeddings":
        return cls(vectors=[list(e.values) for e in response.embeddings],
                   input_tokens=[e.prompt_tokens for e in response.embeddings],
                   prompt_tokens=response.prompt_tokens)


@dataclasses.dataclass
class ModelCard:
    id: str               # the name requests pass as `model`
    name: str             # general.name of the GGUF
    architecture: str
    vocab_size: int
    context_length: int
    fingerprint: str
    created: int          # unix seconds

    @classmethod
    def from_proto(cls, served) -> "ModelCard":
        info = served.info
        return cls(id=served.id, name=info.name, architecture=info.architecture,
                   vocab_size=info.vocab_size, context_length=info.context_length,
                   fingerprint=info.fingerprint, created=served.created)


@dataclasses.dataclass
class ReplicaState:
    replica_id: str
    healthy: bool
    worker_address: str
    backend: str
    num_kv_blocks: int
    num_free_blocks: int
    kv_cache_usage: float
    num_running: int
    num_waiting: int
    num_steps: int
    num_preemptions: int

    @classmethod
    def from_proto(cls, r) -> "ReplicaState":
        return cls(replica_id=r.replica_id, healthy=r.healthy, worker_address=r.worker_address,
                   backend=r.backend, num_kv_blocks=r.num_kv_blocks, num_free_blocks=r.num_free_blocks,
                   kv_cache_usage=r.kv_cache_usage, num_running=r.num_running,
                   num_waiting=r.num_waiting, num_steps=r.num_steps,
                   num_preemptions=r.num_preemptions)


@dataclasses.dataclass
class ClusterState:
    model: str
    draining: bool
    num_healthy_replicas: int
    num_waiting: int
    num_running: int
    replicas: list[ReplicaState]

    @classmethod
    def from_proto(cls, s) -> "ClusterState":
        return cls(model=s.model, draining=s.draining, num_healthy_replicas=s.num_healthy_replicas,
                   num_waiting=s.num_waiting, num_running=s.num_running,
                   replicas=[ReplicaState.from_proto(r) for r in s.replicas])
