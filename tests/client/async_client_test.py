"""The Python SDK's asyncio client (client/python/loom_client/aio.py, AsyncLoomClient over
grpc.aio) against real processes: a coordinator (`loom serve`) and one CPU worker.

* generate and generate_stream: greedy text equals the blocking client's; many requests at
  once from one event loop share the batch;
* chat with a required tool call (grammar-enforced) as the blocking client returns it;
* closing a stream mid-generation frees its KV blocks; a deadline is DEADLINE_EXCEEDED;
* unary calls; client errors are LoomError and not retried;
* the package is typed (py.typed, PEP 561).
"""
import asyncio
import json
import pathlib

import grpc
import pytest

from client_test_util import LONG_RUN_TOKENS, PROMPT, blocks_in_use, h, require_cluster_binaries
import loom_client
from loom_client import AsyncLoomClient, LoomClient, LoomError

# Outcomes that rest on time: scripts/test-slow-machine.sh runs them again on one core.
pytestmark = pytest.mark.slow_machine

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}]


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    require_cluster_binaries()
    with h.running_cluster(tmp_path_factory.mktemp("async_client"), {"r0": {"threads": 1}}) as rig:
        yield rig


@pytest.fixture(scope="module")
def reference(rig):
    with LoomClient(rig.coordinator.address, timeout=120) as client:
        return client.generate(PROMPT, max_tokens=16).text


def run(coroutine):
    return asyncio.run(coroutine)


def test_generate_and_stream_equal_the_blocking_client(rig, reference):
    async def main():
        async with AsyncLoomClient(rig.coordinator.address, timeout=120) as client:
            completion = await client.generate(PROMPT, max_tokens=16)
            chunks = []
            async with client.generate_stream(PROMPT, max_tokens=16) as stream:
                async for chunk in stream:
                    chunks.append(chunk)
            return completion, chunks

    completion, chunks = run(main())
    assert completion.text == reference
    assert completion.finish_reason in ("stop", "length")
    assert completion.attempts == 1
    assert "".join(c.text for c in chunks) == reference
    assert chunks[-1].finish_reason == completion.finish_reason
    assert all(c.finish_reason is None for c in chunks[:-1])


def test_embed_equals_the_blocking_client(rig):
    async def main():
        async with AsyncLoomClient(rig.coordinator.address, timeout=120) as client:
            return await client.embed(["Hello there.", [1, 2, 3]])

    got = run(main())
    with LoomClient(rig.coordinator.address, timeout=120) as blocking:
        want = blocking.embed(["Hello there.", [1, 2, 3]])
    assert got == want and len(got.vectors) == 2


def test_concurrent_requests_from_one_event_loop(rig, reference):
    async def main():
        async with AsyncLoomClient(rig.coordinator.address, timeout=120) as client:
            return await asyncio.gather(*(client.generate(PROMPT, max_tokens=16) for _ in range(8)))

    completions = run(main())
    assert len(completions) == 8
    assert all(c.text == reference for c in completions)


def test_prompt_logprobs_from_both_clients(rig):
    async def main():
        async with AsyncLoomClient(rig.coordinator.address, timeout=120) as client:
            return await client.generate(PROMPT, max_tokens=1, prompt_logprobs=2)

    scored = run(main())
    with LoomClient(rig.coordinator.address, timeout=120) as client:
        blocking = client.generate(PROMPT, max_tokens=1, prompt_logprobs=2)
        plain = client.generate(PROMPT, max_tokens=1)
    assert plain.prompt_logprobs == []
    assert len(scored.prompt_logprobs) == scored.prompt_tokens - 1
    assert [p.token_id for p in scored.prompt_logprobs] == [p.token_id for p in blocking.prompt_logprobs]
    for mine, theirs in zip(scored.prompt_logprobs, blocking.prompt_logprobs):
        assert mine.logprob == pytest.approx(theirs.logprob, abs=1e-4)
        assert len(mine.top) == 2 and mine.rank >= 1
        assert (mine.rank == 1) == (mine.top[0][0] == mine.token_id)


def test_chat_with_a_required_tool_call(rig):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    with LoomClient(rig.coordinator.address, timeout=120) as blocking:
        expected = blocking.chat(messages, tools=TOOLS, tool_choice="required", max_tokens=64, seed=1)

    async def main():
        async with AsyncLoomClient(rig.coordinator.address, timeout=120) as client:
            return await client.chat(messages, tools=TOOLS, tool_choice="required", max_tokens=64,
                                     seed=1)

    reply = run(main())
    assert [(c.name, c.arguments) for c in reply.tool_calls] == \
        [(c.name, c.arguments) for c in expected.tool_calls]
    assert reply.tool_calls[0].name == "get_weather"
    assert set(json.loads(reply.tool_calls[0].arguments)) == {"city", "unit"}


def test_closing_a_stream_mid_generation_frees_its_kv_blocks(rig):
    coordinator = rig.coordinator

    async def main():
        async with AsyncLoomClient(coordinator.address, timeout=120) as client:
            stream = client.generate_stream(h.LONG_PARAGRAPH, max_tokens=LONG_RUN_TOKENS,
                                            ignore_eos=True)
            tokens = 0
            async for chunk in stream:
                tokens += len(chunk.token_ids)
                if tokens >= 4:
                    break
            in_use = blocks_in_use(coordinator)
            stream.close()
            with pytest.raises(LoomError) as error:
                await stream.__anext__()
            return tokens, in_use, error.value.code

    tokens, in_use, code = run(main())
    assert tokens >= 4 and in_use > 0
    assert code == grpc.StatusCode.CANCELLED
    coordinator.wait_idle(timeout=15)


def test_deadline_and_client_errors(rig):
    async def main():
        async with AsyncLoomClient(rig.coordinator.address, timeout=120) as client:
            with pytest.raises(LoomError) as deadline:
                await client.generate(h.LONG_PARAGRAPH, max_tokens=LONG_RUN_TOKENS, ignore_eos=True,
                                      timeout=2.0)
            with pytest.raises(LoomError) as invalid:
                await client.detokenize([10 ** 9])
            ids = await client.tokenize(PROMPT)
            text = await client.detokenize(ids, skip_special_tokens=True)
            models = await client.list_models()
            state = await client.cluster_state()
            return deadline.value, invalid.value, text, models, state

    deadline, invalid, text, models, state = run(main())
    assert deadline.code == grpc.StatusCode.DEADLINE_EXCEEDED and deadline.attempts == 1
    assert invalid.code == grpc.StatusCode.INVALID_ARGUMENT and invalid.attempts == 1
    assert text.strip() == PROMPT
    assert models and models[0].id
    assert [r.replica_id for r in state.replicas] == ["r0"]
    rig.coordinator.wait_idle(timeout=15)


def test_the_package_is_typed():
    assert (pathlib.Path(loom_client.__file__).parent / "py.typed").is_file()
