"""Prefix caching end to end: a coordinator with prefix caching on (two replicas, prefix-aware
routing) and one with it off (one replica), real `loom serve` and `loom-worker` processes on the
default model. The same shared-prefix requests (one long system prompt, many user turns; and a
multi-turn conversation that resends its history) go to both: greedy outputs must be identical,
seeded sampled outputs too, the repeats must report cached prompt tokens on the caching
coordinator and none on the other, a different cache_salt must not share, and a repeated prefix
must land on the replica that holds it.
"""
import pytest

import cluster_harness as h
from cluster_harness import make_request

CALL_TIMEOUT_S = 180
MAX_TOKENS = 12

SYSTEM = ("You are a careful assistant for a company that builds distributed inference systems. "
          "Answer briefly and precisely. The cluster has a coordinator that schedules continuous "
          "batches and owns the KV block table, and workers that run the model on a paged KV cache. "
          "Blocks hold sixteen tokens each; full blocks are identified by a chained hash so that a "
          "prompt prefix computed once can be reused by every later request that shares it. ")
QUESTIONS = ("What is a KV block?", "Why share prefixes?", "Name one scheduling policy.",
             "What does the coordinator own?", "How large is a block?", "What is a worker?")


def generate_last(stub, request):
    """(token ids, the final message) of one Generate call."""
    tokens, last = [], None
    for message in stub.Generate(request, timeout=CALL_TIMEOUT_S):
        tokens.extend(message.token_ids)
        last = message
    assert last is not None and last.finish_reason != 0, last
    return tokens, last


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    with h.running_cluster(h.cluster_log_dir(tmp_path_factory, "cache_on"),
                           {"replica-a": {"threads": 1}, "replica-b": {"threads": 1}},
                           prefix_caching="on", routing="prefix") as on, \
         h.running_cluster(tmp_path_factory.mktemp("cache_off"), {"replica-c": {"threads": 1}},
                           prefix_caching="off") as off:
        yield on.coordinator, off.coordinator


def test_outputs_with_caching_equal_outputs_without(clusters):
    on, off = clusters
    requests = [make_request(SYSTEM + q, max_tokens=MAX_TOKENS, ignore_eos=True) for q in QUESTIONS]
    # The first request primes the cache; the rest (sent one by one so each finds it) reuse it.
    results_on = [generate_last(on.stub, r) for r in requests]
    results_off = [generate_last(off.stub, r) for r in requests]
    for question, (tokens_on, last_on), (tokens_off, last_off) in zip(QUESTIONS, results_on, results_off):
        assert tokens_on == tokens_off, f"{question!r}: caching changed the greedy output"
        assert len(tokens_on) == MAX_TOKENS
        assert last_off.cached_prompt_tokens == 0, last_off
    assert results_on[0][1].cached_prompt_tokens == 0
    for question, (_, last) in zip(QUESTIONS[1:], results_on[1:]):
        # The system prompt is ~90 tokens: at least its first full blocks are reused.
        assert last.cached_prompt_tokens >= 64, (question, last)
        assert last.cached_prompt_tokens % 16 == 0
        assert last.cached_prompt_tokens < last.prompt_tokens
    # Sticky placement: every repeat went where the system prompt is cached.
    replicas = {last.replica_id for _, last in results_on}
    assert len(replicas) == 1, replicas

    # Concurrent repeats (shared blocks among running sequences), and seeded sampling.
    concurrent = [make_request(SYSTEM + q + " Explain.", max_tokens=MAX_TOKENS, ignore_eos=True)
                  for q in QUESTIONS]
    concurrent += [make_request(SYSTEM + q, max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.9,
                                seed=1000 + i) for i, q in enumerate(QUESTIONS)]
    outcomes_on = h.generate_all(on.stub, concurrent, timeout=CALL_TIMEOUT_S)
    outcomes_off = h.generate_all(off.stub, concurrent, timeout=CALL_TIMEOUT_S)
    for o_on, o_off in zip(outcomes_on, outcomes_off):
        assert o_on.finished and o_off.finished, (o_on.describe(), o_off.describe())
        assert o_on.token_ids == o_off.token_ids, (o_on.request.text[-40:], o_on.text, o_off.text)


def test_multi_turn_history_is_reused_including_generated_turns(clusters):
    on, off = clusters
    history = SYSTEM
    for turn, question in enumerate(QUESTIONS[:3]):
        history += f"\nUser: {question}\nAssistant:"
        request = make_request(history, max_tokens=MAX_TOKENS, ignore_eos=True)
        tokens_on, last_on = generate_last(on.stub, request)
        tokens_off, _ = generate_last(off.stub, request)
        assert tokens_on == tokens_off, f"turn {turn} differs"
        if turn > 0:
            assert last_on.cached_prompt_tokens >= 64, (turn, last_on)
        history += last_on.text


def test_cache_salt_isolates_and_the_same_salt_shares(clusters):
    on, _ = clusters
    prompt = SYSTEM + "Salted question number one?"
    unsalted = make_request(prompt, max_tokens=2)
    generate_last(on.stub, unsalted)
    salted = make_request(prompt, max_tokens=2)
    salted.cache_salt = "tenant-42"
    tokens_salted, first = generate_last(on.stub, salted)
    assert first.cached_prompt_tokens == 0, "a salted request reused another tenant's blocks"
    tokens_again, again = generate_last(on.stub, salted)
    assert again.cached_prompt_tokens > 0
    assert tokens_again == tokens_salted


def test_every_block_is_free_when_idle(clusters):
    on, off = clusters
    for coordinator in (on, off):
        for replica_id, status in coordinator.wait_idle().items():
            assert status.num_free_blocks == status.num_kv_blocks, (replica_id, status)


@pytest.fixture(scope="module")
def colliding(tmp_path_factory):
    """A caching coordinator whose block hashes all collide (test hook): only the hit
    verification against each block's tokens, parent and salt keeps outputs right."""
    with h.running_cluster(tmp_path_factory.mktemp("colliding"), {"replica-d": {"threads": 1}},
                           prefix_caching="on", debug_colliding_block_hashes="on") as rig:
        yield rig.coordinator


def test_forced_hash_collisions_are_caught_and_served_correctly(clusters, colliding):
    _, off = clusters
    # Same-length prompts whose every block collides with the first one's; then repeats of
    # the shared system prompt, which must still be served from the cache.
    unrelated = [" ".join(reversed((SYSTEM + q).split())) for q in QUESTIONS[:2]]
    prompts = [SYSTEM + QUESTIONS[0], *unrelated, SYSTEM + QUESTIONS[1]]
    salted = make_request(SYSTEM + QUESTIONS[2], max_tokens=MAX_TOKENS, ignore_eos=True)
    salted.cache_salt = "tenant-7"
    requests = [make_request(p, max_tokens=MAX_TOKENS, ignore_eos=True) for p in prompts] + [salted]
    for index, request in enumerate(requests):
        tokens_colliding, last = generate_last(colliding.stub, request)
        tokens_off, _ = generate_last(off.stub, request)
        assert tokens_colliding == tokens_off, f"request {index}: a colliding block was served"
        if index in (1, 2, 4):  # other tokens, or another salt: nothing may be reused
            assert last.cached_prompt_tokens == 0, (index, last)
    _, repeat = generate_last(colliding.stub, requests[3])
    assert repeat.cached_prompt_tokens >= 64, repeat
    for replica_id, status in colliding.wait_idle().items():
        assert status.num_free_blocks == status.num_kv_blocks, (replica_id, status)
