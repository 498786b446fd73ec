"""Preemption by recompute: a worker with a deliberately tiny KV pool (24 blocks of 16 tokens,
--kv-cache-memory 24 x 368640 bytes of f16 K/V for SmolLM2-135M) and 16 concurrent requests that
need ~6 blocks each. All of them complete, their greedy text equals that of the same requests run
one at a time (recompute changes nothing), the replica reports preemptions, and every block is
free afterwards.
"""
import grpc
import pytest

import cluster_harness as h
from cluster_harness import make_request

# Outcomes that rest on time: scripts/test-slow-machine.sh runs them again on one core.
pytestmark = pytest.mark.slow_machine

NUM_BLOCKS = 24
KV_CACHE_MEMORY = f"{NUM_BLOCKS * h.SMOLLM2_BLOCK_BYTES // 1024}KiB"  # 8640KiB
MAX_TOKENS = 40
CALL_TIMEOUT_S = 150

# Eight prompts of ~40-50 tokens (3-4 blocks; + 40 output tokens: 6 blocks each).
PROMPTS = tuple(
    f"Story {i}: {opening} The keys and the values of every token are cached in blocks of sixteen "
    "tokens, and when the blocks run out a sequence is preempted and computed again. Then"
    for i, opening in enumerate((
        "Once upon a time there was a lighthouse keeper.",
        "The train left the station late in the evening.",
        "A small robot woke up in an empty warehouse.",
        "The market was loud and full of colors.",
        "Snow fell on the mountain village all night.",
        "Two friends argued about the best pizza in town.",
        "An old map was hidden inside a library book.",
        "The scientist checked her results a third time.",
    )))


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    with h.running_cluster(h.cluster_log_dir(tmp_path_factory, "preemption"),
                           {"replica-a": {"threads": 2, "kv_cache_memory": KV_CACHE_MEMORY}}) as rig:
        yield rig


def test_sixteen_requests_complete_on_a_tiny_kv_pool_with_preemption(rig):
    coordinator = rig.coordinator
    start = coordinator.replicas()["replica-a"]
    assert start.num_kv_blocks == NUM_BLOCKS, (
        f"--kv-cache-memory {KV_CACHE_MEMORY} should give {NUM_BLOCKS} blocks of "
        f"{h.SMOLLM2_BLOCK_BYTES} bytes: {start}")
    assert start.num_free_blocks == NUM_BLOCKS, start

    def request(prompt):
        return make_request(prompt, max_tokens=MAX_TOKENS, ignore_eos=True)

    # Uncontended: one request at a time, so nothing is ever preempted.
    alone = {}
    for prompt in PROMPTS:
        outcome = h.generate(coordinator.stub, request(prompt), timeout=CALL_TIMEOUT_S)
        assert outcome.finished and len(outcome.token_ids) == MAX_TOKENS, outcome.describe()
        blocks = -(-(outcome.prompt_tokens + MAX_TOKENS) // 16)
        assert 5 <= blocks <= NUM_BLOCKS // 2, f"prompt of {outcome.prompt_tokens} tokens needs {blocks} blocks"
        alone[prompt] = outcome
    uncontended = coordinator.replicas()["replica-a"]
    assert uncontended.num_preemptions == start.num_preemptions, uncontended

    # Contended: 16 at once need ~96 blocks of a 24-block pool.
    outcomes = h.generate_all(coordinator.stub, [request(PROMPTS[i % len(PROMPTS)]) for i in range(16)],
                              timeout=CALL_TIMEOUT_S)
    for outcome in outcomes:
        prompt = outcome.request.text
        assert outcome.finished, outcome.describe()
        assert outcome.finish_reason == h.stubs().pb.FinishReason.Value("FINISH_REASON_LENGTH"), \
            outcome.describe()
        assert outcome.token_ids == alone[prompt].token_ids, (
            f"contended output differs from the uncontended one for {prompt[:20]!r}:\n"
            f" contended:   {outcome.text!r}\n uncontended: {alone[prompt].text!r}")
        assert outcome.text == alone[prompt].text

    end = coordinator.wait_idle()["replica-a"]
    assert end.num_preemptions > uncontended.num_preemptions, (
        f"16 requests of ~6 blocks on a {NUM_BLOCKS}-block pool should force preemptions: {end}")
    assert end.num_free_blocks == NUM_BLOCKS, end
    assert end.healthy, end


def test_request_larger_than_the_kv_pool_is_rejected(rig):
    """A request that could never fit in the replica's pool is refused, not queued forever."""
    ids = h.tokenize(PROMPTS[0])
    outcome = h.generate(rig.coordinator.stub,
                         make_request(token_ids=ids, max_tokens=NUM_BLOCKS * 16, ignore_eos=True),
                         timeout=30)
    assert outcome.code == grpc.StatusCode.INVALID_ARGUMENT, outcome.describe()
    assert outcome.details, outcome.describe()
    rig.coordinator.wait_idle()
