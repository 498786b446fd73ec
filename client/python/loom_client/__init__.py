"""Python client of Loom's gRPC inference API (loom.v1.Inference).

    from loom_client import LoomClient

    with LoomClient("127.0.0.1:50051") as client:
        print(client.generate("The capital of France is", max_tokens=16).text)
        for chunk in client.generate_stream("Tell me a story", max_tokens=64):
            print(chunk.text, end="", flush=True)
        reply = client.chat([{"role": "user", "content": "Weather in Paris?"}],
                            tools=[{"name": "get_weather", "parameters": {...}}],
                            tool_choice="required", max_tokens=64)
        print(reply.tool_calls)

AsyncLoomClient has the same calls as coroutines (grpc.aio): `await client.generate(...)`,
`async for chunk in client.generate_stream(...)`.
"""
from loom_client.aio import AsyncGenerateStream, AsyncLoomClient
from loom_client.client import LoomClient, RetryPolicy
from loom_client.errors import LoomError
from loom_client.stream import GenerateStream
from loom_client.types import (Chunk, ClusterState, Completion, Embeddings, ModelCard, ReplicaState,
                               PromptTokenLogprob, TokenLogprob, ToolCall)

__all__ = ["LoomClient", "AsyncLoomClient", "AsyncGenerateStream", "RetryPolicy", "LoomError", "GenerateStream", "Chunk", "ClusterState",
           "Completion", "Embeddings", "ModelCard", "ReplicaState", "PromptTokenLogprob", "TokenLogprob", "ToolCall"]
