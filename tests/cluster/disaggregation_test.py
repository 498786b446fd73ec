"""Disaggregated prefill and decode over real processes (`loom up --prefill-replicas 1
--decode-replicas 1`, and a prefill replica of two tensor-parallel ranks). A prompt with more
uncached tokens than --max-local-prefill-length is prefilled on the prefill replica, which
streams its first token and hands the request to the decode replica; that replica fetches the
prompt's KV from the prefill worker's host tier (mapping KV heads when the tensor-parallel sizes
differ) and decodes the rest. Shorter prompts run on the decode replica alone. 100 greedy
prompts (every seventh seeded sampling instead, compared at one tensor-parallel size; 40 for
the TCP and pulled transports) give the tokens of one mixed replica, every hand-off counted on
both sides, every block free afterwards.

The failure cases run on separately started workers, the prefill one slowed
(--debug-step-delay-ms) so each fault lands where it is meant to: the prefill worker killed
while it computes (the request is placed again: the decode replica computes it), killed after the
hand-off while the decode replica waits for its KV (the transfer fails, counted and logged, and
the prompt is recomputed there), the decode worker killed while it waits for the KV (the request
completes on the prefill replica), and a transfer slower than --kv-transfer-timeout-ms
(recomputed). And with --max-prefill-queue-size 1 a busy prefill replica leaves the next long
prompts to the decode replica; with the threshold measured, so does a prefill replica whose
queued prompts would give the first token later than the decode replica itself. Each request
finishes with the reference tokens and no replica holds a block.
"""
import re
import signal
import time
import urllib.request

import grpc
import pytest

import cluster_harness as h
from cluster_harness import make_request

MAX_TOKENS = 8
THRESHOLD = 24  # --max-local-prefill-length
WORDS = ("river stone garden lantern harbor meadow copper violet signal orchard canyon willow "
         "thunder paper marble falcon ember glacier cobalt saffron").split()


def prompt(i: int) -> str:
    """Prompt i of 100: every fifth one short (runs on the decode replica), the others 40 to 110
    tokens (more than THRESHOLD + a block), none sharing a prefix with another."""
    if i % 5 == 0:
        return f"Say hello to friend number {i}."
    words = [WORDS[(i * 7 + k * (i % 11 + 1)) % len(WORDS)] for k in range(24 + (i * 13) % 60)]
    return f"Note {i}: " + " ".join(words) + "\nOne line about it:"


PROMPTS = [prompt(i) for i in range(100)]


def seeded(i: int) -> bool:
    """Every seventh prompt samples (temperature 0.8, seed i): a hand-off continues the seeded
    sampler where the prefill replica left it."""
    return i % 7 == 3
# f32 activations: two ranks' partial sums round differently from one process's, and only f32
# keeps that below the greedy choice (tests/cluster/tensor_parallel_test.py).
COMMON = {"threads": 1, "kv_cache_memory": "64MiB", "activations": "f32"}


@pytest.fixture(scope="module")
def binaries():
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)


def run_all(stub, prompts=PROMPTS):
    requests = [make_request(p, max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.8 if seeded(i) else None,
                             seed=i if seeded(i) else None) for i, p in enumerate(prompts)]
    outcomes = h.generate_all(stub, requests, timeout=600)
    for outcome in outcomes:
        assert outcome.finished, outcome.describe()
    return outcomes


@pytest.fixture(scope="module")
def mixed_tokens(binaries, tmp_path_factory):
    """first(count): the first `count` prompts' tokens on one mixed replica, run once for the
    most asked. The serving test (first in the file) asks for all 100 and the failure tests
    reuse them; run alone, as scripts/test-slow-machine.sh runs them, the failure tests run
    only the 40 they use."""
    tokens = []

    def first(count):
        if len(tokens) < count:
            up = h.Up(tmp_path_factory.mktemp("mixed"), http_port=-1, **COMMON)
            try:
                up.wait_healthy(["replica-0"])
                tokens[:] = [o.token_ids for o in run_all(up.stub, PROMPTS[:count])]
            finally:
                up.stop()
        return tokens
    return first


@pytest.fixture(scope="module")
def all_references(mixed_tokens):
    return mixed_tokens(len(PROMPTS))


@pytest.fixture(scope="module")
def reference(mixed_tokens):
    """The first 40 prompts' tokens (the failure tests use no other)."""
    return mixed_tokens(40)


@pytest.mark.parametrize("prefill_tp,push,count", [(1, "shared", 100), (2, "shared", 100), (2, "tcp", 40),
                                                  (1, None, 40), (1, "pool", 40), (2, "pool", 40)],
                         ids=["tp1-to-tp1-pushed", "tp2-to-tp1-pushed", "tp2-to-tp1-pushed-over-tcp",
                              "tp1-to-tp1-pulled", "tp1-to-tp1-pool-to-pool", "tp2-to-tp1-pool-to-pool"])
def test_disaggregated_serving_gives_the_tokens_of_mixed_serving(binaries, all_references, tmp_path, prefill_tp,
                                                                 push, count):
    # Pushed: the prefill workers write each prompt's KV into the decode workers' host tiers
    # layer by layer while computing it (KV heads mapped from 2 ranks to 1), through shared
    # memory or over TCP (--no-kv-shared-memory: the decode worker's tier cannot be mapped, as
    # between machines); pulled (--no-kv-push): the decode replica fetches it after the first
    # token; pool to pool (--no-kv-push, the workers' pools in shared memory): the decode
    # workers copy it straight out of the prefill worker's pool into their own after the first
    # token, no host tier between (as CUDA pools do through IPC; from 2 ranks to 1, each rank's
    # KV heads of every token row). The 100 prompts at TP 1->1 and 2->1; the other
    # transports on the first 40 (32 of them handed off).
    pushed = push in ("shared", "tcp")
    up = h.Up(tmp_path, prefill_replicas=1, decode_replicas=1, prefill_tensor_parallel_size=prefill_tp,
              max_local_prefill_length=THRESHOLD, max_prefill_queue_size=0,
              kv_push=None if pushed else "off", kv_shared_memory="off" if push == "tcp" else None,
              kv_pool_shared_memory="on" if push == "pool" else None, **COMMON)
    try:
        status = up.wait_healthy(["prefill-0", "decode-0"])
        assert status["prefill-0"].role == "prefill" and status["decode-0"].role == "decode"
        outcomes = run_all(up.stub, PROMPTS[:count])
        # Seeded sampling compares at one tensor-parallel size: across sizes the logits differ in
        # their last bits, which a sampler may turn into another token now and then.
        mismatched = [(PROMPTS[i], o.token_ids, all_references[i]) for i, o in enumerate(outcomes)
                      if o.token_ids != all_references[i] and (prefill_tp == 1 or not seeded(i))]
        assert not mismatched, mismatched[:3]
        long_prompts = [o for i, o in enumerate(outcomes) if i % 5 != 0]
        for i, outcome in enumerate(outcomes):
            if i % 5 == 0:  # short: the decode replica alone
                assert outcome.replica_id == outcome.last_replica_id == "decode-0", outcome.describe()
            else:  # the first token from the prefill replica, the rest from the decode replica
                assert (outcome.replica_id, outcome.last_replica_id) == ("prefill-0", "decode-0"), \
                    outcome.describe()
        status = up.wait_idle()
        prefill, decode = status["prefill-0"], status["decode-0"]
        assert prefill.num_handoffs_out == len(long_prompts) == decode.num_handoffs_in, (prefill, decode)
        assert decode.num_reserved_blocks == 0, decode
        # The log says why a hand-off failed (it recomputed: the tokens would agree anyway).
        assert decode.num_handoff_failures == 0 and decode.num_kv_fetch_failures == 0, \
            (decode, up.log_tail(30000))
        long_blocks = sum(1 for i in range(count) if i % 5 != 0)  # at least one full block each
        if pushed:
            # A prompt whose only plan was sent before its decode replica named the slots (or
            # whose slots that replica's tier could not hold beside the burst's others) is
            # pulled: every hand-off one or the other.
            assert decode.num_handoffs_pushed > 0, decode
            assert decode.num_kv_fetches == decode.num_handoffs_in - decode.num_handoffs_pushed, decode
            assert decode.num_kv_blocks_reloaded >= long_blocks, decode
        elif push == "pool":
            assert decode.num_handoffs_pushed == 0, decode
            assert decode.num_kv_pool_fetches == decode.num_kv_fetches == decode.num_handoffs_in, decode
            assert decode.num_kv_fetched_blocks >= long_blocks, decode
            assert decode.num_kv_blocks_reloaded == 0, decode  # the blocks arrived in the pool
            assert prefill.num_free_blocks == prefill.num_kv_blocks, prefill  # its holds ended
        else:
            assert decode.num_handoffs_pushed == 0, decode
            assert decode.num_kv_fetched_blocks >= long_blocks, decode
            assert decode.num_kv_blocks_reloaded >= decode.num_kv_fetched_blocks
        metrics = urllib.request.urlopen(up.http_url + "/metrics", timeout=10).read().decode()
        for line in (f'loom_disagg_handoffs_total{{direction="out",model_name="SmolLM2-135M-Instruct.Q4_1",'
                     f'replica="prefill-0"}} {len(long_prompts)}',
                     f'loom_disagg_handoffs_total{{direction="in",model_name="SmolLM2-135M-Instruct.Q4_1",'
                     f'replica="decode-0"}} {len(long_prompts)}',
                     f'loom_disagg_phase_seconds_count{{model_name="SmolLM2-135M-Instruct.Q4_1",'
                     f'phase="transfer"}} {len(long_prompts)}'):
            assert line in metrics, [m for m in metrics.splitlines() if "disagg" in m][:20]
    finally:
        up.stop()


# ---- failures: separately started workers, the prefill one slowed ----

LONG = PROMPTS[1]
FAILURE_TOKENS = 4  # a request may decode on the slowed prefill replica: fewer steps


def disaggregated(tmp_path, prefill_delay_ms, decode_flags=None, **coordinator_flags):
    return h.running_cluster(
        tmp_path,
        {"prefill-0": {**COMMON, "role": "prefill", "debug_step_delay_ms": prefill_delay_ms},
         "decode-0": {**COMMON, "role": "decode", **(decode_flags or {})}},
        max_local_prefill_length=THRESHOLD, **coordinator_flags)


# Pushes through the decode worker's memory (one machine), or over TCP as between machines
# (the decode worker started with --no-kv-shared-memory: its tier cannot be mapped).
TRANSPORTS = pytest.mark.parametrize("decode_flags", [{"metrics_port": 0},
                                                     {"kv_shared_memory": "off", "metrics_port": 0}],
                                     ids=["shared-memory", "tcp"])
# A host-tier slot of the default model: 30 layers x K and V x 16 tokens x 3 heads x 64 x 2 bytes.
SLOT_BYTES = 30 * 2 * 16 * 3 * 64 * 2


def bytes_pushed_over_tcp(rig, replica_id="decode-0"):
    """What the worker's /metrics count of KV bytes it received from peers over TCP."""
    match = re.search(r"metrics on (http://\S+/metrics)", "\n".join(rig.workers[replica_id].stdout_lines()))
    assert match, rig.workers[replica_id].log_tail()
    metrics = urllib.request.urlopen(match.group(1), timeout=10).read().decode()
    found = re.search(r'loom_worker_kv_transfer_bytes_total\{[^}]*direction="from_peer"[^}]*\} (\S+)', metrics)
    assert found, [m for m in metrics.splitlines() if "transfer" in m]
    return float(found.group(1))


def long_prompt_tokens(rig):
    request = h.stubs().pb.TokenizeRequest(text=LONG, add_special_tokens=True, parse_special=True)
    return len(rig.coordinator.stub.Tokenize(request).token_ids)


def long_prompt_blocks(rig):
    """The blocks LONG and its first token take on the decode replica: what placement reserves."""
    return (long_prompt_tokens(rig) + 16) // 16


def start(rig):
    return h.Stream(rig.coordinator.stub, make_request(LONG, max_tokens=FAILURE_TOKENS, ignore_eos=True),
                    timeout=180)


def start_pushed(rig):
    """LONG started, once it runs on the prefill replica and the decode replica holds a slot for
    each of its blocks (the push's target); and how many."""
    blocks = (long_prompt_tokens(rig) + 15) // 16
    stream = start(rig)
    wait_for(rig, lambda r: r["prefill-0"].num_running == 1 and r["decode-0"].num_host_kv_blocks_held == blocks,
             "the prompt prefilling, the push's slots held")
    return blocks, stream


def wait_for(rig, predicate, what, timeout=60):
    return rig.coordinator.wait_replicas(predicate, timeout, what)


def finishes_with_reference(stream, reference, where):
    outcome = stream.join(180)
    assert outcome.finished, outcome.describe()
    assert outcome.token_ids == reference[1][:FAILURE_TOKENS], (outcome.describe(), reference[1])
    assert outcome.last_replica_id == where, outcome.describe()


def no_block_held(rig, replica_ids):
    status = rig.coordinator.wait_replicas(
        lambda r: all(r[i].healthy and r[i].num_running == 0 and r[i].num_waiting == 0 and
                      r[i].num_free_blocks == r[i].num_kv_blocks and r[i].num_reserved_blocks == 0
                      for i in replica_ids),
        30, f"{replica_ids} idle with every block free and none reserved")
    return status


@TRANSPORTS
def test_a_prompt_computed_in_several_plans_has_its_kv_pushed_layer_by_layer(binaries, reference, tmp_path,
                                                                             decode_flags):
    # 32-token plans on a slowed prefill worker: the decode replica names its slots during the
    # first plan, the next plans carry the blocks completed so far (earlier chunks' too), and
    # when the first token comes every block is in the decode worker's tier, the partial last
    # one too: nothing is fetched or recomputed, the tokens are the mixed replica's, every
    # hold ends.
    with disaggregated(tmp_path, prefill_delay_ms=300, decode_flags=decode_flags,
                       max_num_batched_tokens=32) as rig:
        finishes_with_reference(start(rig), reference, "decode-0")
        status = no_block_held(rig, ["decode-0", "prefill-0"])
        assert status["prefill-0"].num_handoffs_out == 1, status["prefill-0"]
        assert status["decode-0"].num_handoffs_in == 1 == status["decode-0"].num_handoffs_pushed, \
            status["decode-0"]
        assert status["decode-0"].num_kv_fetches == 0, status["decode-0"]
        assert status["decode-0"].num_handoff_failures == 0
        tokens = long_prompt_tokens(rig)
        assert tokens % 16 != 0, tokens  # a partial last block
        assert status["decode-0"].num_kv_blocks_reloaded == (tokens + 15) // 16, status["decode-0"]
        assert status["decode-0"].num_host_hit_tokens == tokens, status["decode-0"]
        # Every block over TCP, each byte once; through shared memory nothing crosses TCP.
        over_tcp = decode_flags.get("kv_shared_memory") == "off"
        assert bytes_pushed_over_tcp(rig) == ((tokens + 15) // 16 * SLOT_BYTES if over_tcp else 0)
        metrics = urllib.request.urlopen(rig.coordinator.http_url + "/metrics", timeout=10).read().decode()
        assert re.search(r'loom_disagg_handoffs_pushed_total\{[^}]*replica="decode-0"\} 1\b', metrics), \
            [m for m in metrics.splitlines() if "pushed" in m]


@TRANSPORTS
def test_prompts_computed_in_one_plan_have_their_kv_pushed_too(binaries, reference, tmp_path, decode_flags):
    # An idle prefill replica would send a prompt's only plan at once; it waits (briefly) for
    # the decode replica to name its slots, so that plan pushes every layer as it computes it:
    # each hand-off pushed, nothing fetched, the mixed replica's tokens.
    with disaggregated(tmp_path, prefill_delay_ms=0, decode_flags=decode_flags) as rig:
        chosen = [i for i in range(1, 30) if i % 5 != 0 and not seeded(i)][:8]
        for i in chosen:
            outcome = h.Stream(rig.coordinator.stub, make_request(PROMPTS[i], max_tokens=MAX_TOKENS, ignore_eos=True),
                               timeout=180).join(180)
            assert outcome.finished, outcome.describe()
            assert outcome.token_ids == reference[i], (PROMPTS[i], outcome.token_ids, reference[i])
            assert (outcome.replica_id, outcome.last_replica_id) == ("prefill-0", "decode-0"), outcome.describe()
        status = no_block_held(rig, ["decode-0", "prefill-0"])
        decode = status["decode-0"]
        assert decode.num_handoffs_in == len(chosen) == decode.num_handoffs_pushed, decode
        assert decode.num_kv_fetches == 0 and decode.num_handoff_failures == 0, decode


@pytest.mark.slow_machine
@TRANSPORTS
def test_a_request_cancelled_while_its_kv_is_pushed_keeps_the_slots_until_the_plan_came_back(
        binaries, reference, tmp_path, decode_flags):
    # 32-token plans on a prefill worker slowed to 4 s a step: the client goes away while the
    # first plan runs, pushing the prompt's first blocks into the decode worker's tier. The
    # slots held for the push stay held until that plan has come back (given back at once,
    # one could be the target of the decode replica's next offload while a layer of the
    # cancelled prompt is still on its way into it); then every one goes.
    with disaggregated(tmp_path, prefill_delay_ms=4000, decode_flags=decode_flags,
                       max_num_batched_tokens=32) as rig:
        blocks, stream = start_pushed(rig)
        time.sleep(0.5)  # the prefill worker is in its first plan's delay
        stream.cancel()
        assert stream.join(30).code == grpc.StatusCode.CANCELLED
        wait_for(rig, lambda r: r["prefill-0"].num_running == 0 and r["prefill-0"].num_waiting == 0,
                 "the cancelled request ended", timeout=10)
        # The first plan is still out (it ends about 4 s after it started).
        assert rig.coordinator.replicas()["decode-0"].num_host_kv_blocks_held == blocks
        time.sleep(1.0)
        assert rig.coordinator.replicas()["decode-0"].num_host_kv_blocks_held == blocks
        wait_for(rig, lambda r: r["decode-0"].num_host_kv_blocks_held == 0, "the slots released", timeout=30)
        status = no_block_held(rig, ["decode-0", "prefill-0"])
        assert status["decode-0"].num_handoffs_in == 0, status["decode-0"]
        finishes_with_reference(start(rig), reference, "decode-0")


@pytest.mark.slow_machine
def test_a_prefill_worker_killed_while_it_computes_leaves_the_prompt_to_the_decode_replica(
        binaries, reference, tmp_path):
    with disaggregated(tmp_path, prefill_delay_ms=2000) as rig:
        stream = start(rig)
        # Placement reserved the prompt's blocks on the decode replica; the prefill replica's
        # loss releases them.
        blocks = long_prompt_blocks(rig)
        wait_for(rig, lambda r: r["prefill-0"].num_running == 1 and r["decode-0"].num_reserved_blocks == blocks,
                 f"the prompt running on prefill-0, {blocks} blocks reserved on decode-0")
        pushed = (long_prompt_tokens(rig) + 15) // 16
        assert rig.coordinator.replicas()["decode-0"].num_host_kv_blocks_held == pushed
        rig.workers["prefill-0"].kill()
        wait_for(rig, lambda r: not r["prefill-0"].healthy, "prefill-0 lost", timeout=30)
        # A lost prefill worker might still be running and writing through shared memory:
        # the push's slots stay held for a grace period (5 s) before they go back.
        time.sleep(2)
        assert rig.coordinator.replicas()["decode-0"].num_host_kv_blocks_held >= pushed
        finishes_with_reference(stream, reference, "decode-0")
        status = no_block_held(rig, ["decode-0"])
        assert status["decode-0"].num_handoffs_in == 0
        assert not status["prefill-0"].healthy
        wait_for(rig, lambda r: r["decode-0"].num_host_kv_blocks_held == 0, "the push's slots released",
                 timeout=30)


@pytest.mark.slow_machine
def test_a_prefill_worker_killed_during_the_transfer_makes_the_decode_replica_recompute(
        binaries, reference, tmp_path):
    # The hand-off's KV leaves the prefill worker with its next step (2 s away): it dies before.
    # (Pulled: a pushed hand-off has nothing left to transfer then.)
    with disaggregated(tmp_path, prefill_delay_ms=2000, kv_push="off") as rig:
        stream = start(rig)
        wait_for(rig, lambda r: r["prefill-0"].num_handoffs_out == 1, "the hand-off", timeout=120)
        rig.workers["prefill-0"].kill()
        finishes_with_reference(stream, reference, "decode-0")
        status = no_block_held(rig, ["decode-0"])
        assert status["decode-0"].num_handoffs_in == 1
        assert status["decode-0"].num_handoff_failures == 1, status["decode-0"]
        assert re.search(r"the KV hand-off from prefill replica prefill-0 failed, recomputing the prompt here",
                         rig.coordinator.log_tail(20000)), rig.coordinator.log_tail()


@pytest.mark.slow_machine
def test_a_decode_worker_killed_while_it_waits_for_the_kv_leaves_the_request_to_the_prefill_replica(
        binaries, reference, tmp_path):
    with disaggregated(tmp_path, prefill_delay_ms=2000, kv_push="off") as rig:
        stream = start(rig)
        wait_for(rig, lambda r: r["prefill-0"].num_handoffs_out == 1, "the hand-off", timeout=120)
        rig.workers["decode-0"].kill()
        finishes_with_reference(stream, reference, "prefill-0")
        no_block_held(rig, ["prefill-0"])


@pytest.mark.slow_machine
@TRANSPORTS
def test_a_decode_worker_killed_while_the_kv_is_pushed_to_it_leaves_the_request_to_the_prefill_replica(
        binaries, reference, tmp_path, decode_flags):
    # The prefill worker pushes into the decode worker's tier, 32-token plans 1 s apart; the
    # decode worker dies meanwhile. The hand-off finds it gone: the prefill replica holds the
    # prompt for a pull instead and, with no decode replica left, decodes it itself.
    with disaggregated(tmp_path, prefill_delay_ms=1000, decode_flags=decode_flags,
                       max_num_batched_tokens=32) as rig:
        stream = start(rig)
        wait_for(rig, lambda r: r["prefill-0"].num_running == 1 and r["decode-0"].num_reserved_blocks > 0,
                 "the prompt prefilling with blocks reserved on decode-0", timeout=60)
        time.sleep(1.5)  # a push or two under way
        rig.workers["decode-0"].kill()
        finishes_with_reference(stream, reference, "prefill-0")
        no_block_held(rig, ["prefill-0"])


@pytest.mark.slow_machine
@TRANSPORTS
def test_a_decode_worker_lost_while_its_process_lives_keeps_the_pushed_slots_in_its_next_table(
        binaries, reference, tmp_path, decode_flags):
    # The prefill worker computes the whole prompt in one 8 s plan that pushes it into the
    # decode worker's tier. The decode worker stops meanwhile (SIGSTOP), is lost for its silence,
    # resumes, is told to register again and serves as decode-0's next worker with the same tier
    # memory. That table starts empty, yet keeps the push's slots held until the prefill plan
    # came back: a layer may still land in them (through shared memory nothing refuses it), so
    # an offload given one would be overwritten. The prefill replica stops pushing to the lost
    # worker; the hand-off is pulled and decodes on decode-0.
    # (The heartbeat timeout as failure_test.py's: a starved machine's heartbeats arrive late.)
    with disaggregated(tmp_path, prefill_delay_ms=8000, decode_flags=decode_flags,
                       heartbeat_timeout_ms=2000) as rig:
        blocks, stream = start_pushed(rig)
        decode = rig.workers["decode-0"]
        decode.signal(signal.SIGSTOP)
        try:
            wait_for(rig, lambda r: not r["decode-0"].healthy, "decode-0 lost", timeout=30)
        finally:
            decode.signal(signal.SIGCONT)
        status = wait_for(rig, lambda r: r["decode-0"].healthy, "decode-0 back", timeout=30)
        assert status["prefill-0"].num_running == 1, status["prefill-0"]  # still in its plan
        assert status["decode-0"].num_host_kv_blocks_held == blocks, status["decode-0"]
        finishes_with_reference(stream, reference, "decode-0")
        status = no_block_held(rig, ["decode-0", "prefill-0"])
        assert status["decode-0"].num_handoffs_pushed == 0, status["decode-0"]
        wait_for(rig, lambda r: r["decode-0"].num_host_kv_blocks_held == 0, "the slots released", timeout=30)
        assert "registering again" in decode.log_tail(20000), decode.log_tail()


@pytest.mark.slow_machine
def test_a_client_gone_during_the_transfer_cancels_it_and_leaks_nothing(binaries, reference, tmp_path):
    # The hand-off's KV leaves the prefill worker with its next step (5 s away), so the decode
    # worker's pull waits at the source. The client goes away meanwhile: the coordinator cancels
    # the pull (the decode worker's reads from the source are children of its call), which ends
    # without bringing a block, and every reservation and export hold ends with the request.
    # (Pulled: a pushed hand-off has nothing left to transfer.)
    with disaggregated(tmp_path, prefill_delay_ms=5000, kv_push="off") as rig:
        stream = start(rig)
        assert stream.wait_tokens(1, 120), stream.outcome.describe()
        wait_for(rig, lambda r: r["prefill-0"].num_handoffs_out == 1, "the hand-off", timeout=60)
        time.sleep(0.5)  # the decode replica starts its pull at once: both workers are idle
        stream.cancel()
        outcome = stream.join(30)
        assert outcome.code == grpc.StatusCode.CANCELLED, outcome.describe()
        # Past the source's step: an uncancelled pull would have completed by now.
        time.sleep(6)
        status = no_block_held(rig, ["decode-0", "prefill-0"])
        assert status["decode-0"].num_kv_fetches == 0, status["decode-0"]
        assert status["decode-0"].num_kv_fetch_failures == 0, status["decode-0"]
        assert status["decode-0"].num_handoff_failures == 0, status["decode-0"]
        # The replicas serve on: a request after it gets its tokens.
        finishes_with_reference(start(rig), reference, "decode-0")


@pytest.mark.slow_machine
def test_a_transfer_slower_than_the_timeout_is_recomputed(binaries, reference, tmp_path):
    with disaggregated(tmp_path, prefill_delay_ms=2500, kv_transfer_timeout_ms=800, kv_push="off") as rig:
        stream = start(rig)
        finishes_with_reference(stream, reference, "decode-0")
        status = no_block_held(rig, ["decode-0", "prefill-0"])
        assert status["decode-0"].num_handoff_failures == 1, status["decode-0"]
        assert status["prefill-0"].num_handoffs_out == 1


@pytest.mark.slow_machine
def test_a_busy_prefill_replica_leaves_long_prompts_to_the_decode_replica(binaries, reference, tmp_path):
    # --max-prefill-queue-size 1: while the (slowed) prefill replica holds a request, the next
    # long prompts are prefilled on the decode replica itself, with the same tokens.
    indices = [1, 2, 4]
    with disaggregated(tmp_path, prefill_delay_ms=2000, max_prefill_queue_size=1) as rig:
        first = h.Stream(rig.coordinator.stub, make_request(PROMPTS[1], max_tokens=FAILURE_TOKENS, ignore_eos=True),
                         timeout=180)
        wait_for(rig, lambda r: r["prefill-0"].num_running + r["prefill-0"].num_waiting == 1, "the first on prefill-0")
        others = h.generate_all(rig.coordinator.stub, [
            make_request(PROMPTS[i], max_tokens=FAILURE_TOKENS, ignore_eos=True) for i in indices[1:]], timeout=180)
        outcomes = [first.join(180)] + others
        for i, outcome in zip(indices, outcomes):
            assert outcome.finished, outcome.describe()
            assert outcome.token_ids == reference[i][:FAILURE_TOKENS], (i, outcome.text)
        assert outcomes[0].replica_id == "prefill-0"
        assert [o.replica_id for o in others] == ["decode-0", "decode-0"]
        status = no_block_held(rig, ["decode-0", "prefill-0"])
        assert status["prefill-0"].num_handoffs_out == 1 == status["decode-0"].num_handoffs_in



def test_a_prefill_replica_whose_kv_the_decode_replica_cannot_read_is_passed_over(binaries, reference, tmp_path):
    # f32 KV on the prefill worker, f16 on the decode one: a hand-off's KV could not be read, so
    # long prompts are prefilled on the decode replica (not computed twice), logged once.
    workers = {"prefill-0": {**COMMON, "role": "prefill", "kv_dtype": "f32"},
               "decode-0": {**COMMON, "role": "decode"}}
    with h.running_cluster(tmp_path, workers, max_local_prefill_length=THRESHOLD) as rig:
        outcomes = h.generate_all(rig.coordinator.stub, [
            make_request(PROMPTS[i], max_tokens=FAILURE_TOKENS, ignore_eos=True) for i in (1, 2)], timeout=180)
        for i, outcome in zip((1, 2), outcomes):
            assert outcome.finished, outcome.describe()
            assert outcome.token_ids == reference[i][:FAILURE_TOKENS], (i, outcome.text)
            assert outcome.replica_id == outcome.last_replica_id == "decode-0", outcome.describe()
        status = no_block_held(rig, ["decode-0", "prefill-0"])
        assert status["prefill-0"].num_handoffs_out == 0 == status["decode-0"].num_handoffs_in
        log = rig.coordinator.log_tail(20000)
        assert len(re.findall(r"prefill replica prefill-0 \(.*f32 KV\) cannot hand KV to decode replica "
                              r"decode-0 \(.*f16 KV\)", log)) == 1, log[-3000:]


def test_a_decode_replica_that_cannot_open_the_prefill_pool_takes_the_host_tiers(binaries, reference, tmp_path):
    # Both pools shared and pushes off: hand-offs would go pool to pool, but the decode worker
    # cannot open the prefill worker's pool (--debug-kv-pool-unreadable, as GPUs without peer
    # access): the first hand-off fails and is recomputed, logged once, and the next is pulled
    # through the host tiers instead of failing too.
    pool = {"kv_pool_shared_memory": "on"}
    workers = {"prefill-0": {**COMMON, **pool, "role": "prefill"},
               "decode-0": {**COMMON, **pool, "role": "decode", "debug_kv_pool_unreadable": "on"}}
    with h.running_cluster(tmp_path, workers, max_local_prefill_length=THRESHOLD, kv_push="off") as rig:
        for i in (1, 2):  # one after the other: the second is placed after the first failed
            [outcome] = h.generate_all(rig.coordinator.stub, [
                make_request(PROMPTS[i], max_tokens=FAILURE_TOKENS, ignore_eos=True)], timeout=180)
            assert outcome.finished, outcome.describe()
            assert outcome.token_ids == reference[i][:FAILURE_TOKENS], (i, outcome.text)
            assert (outcome.replica_id, outcome.last_replica_id) == ("prefill-0", "decode-0"), \
                outcome.describe()
        status = no_block_held(rig, ["decode-0", "prefill-0"])
        decode = status["decode-0"]
        assert decode.num_handoffs_in == 2 and decode.num_handoff_failures == 1, decode
        assert decode.num_kv_fetches == 1 and decode.num_kv_pool_fetches == 0, decode
        log = rig.coordinator.log_tail(20000)
        assert len(re.findall(r"replica decode-0: reading replica prefill-0's KV pool failed \(.*"
                              r"--debug-kv-pool-unreadable\)\): its KV goes through the host tiers", log)) == 1, \
            log[-3000:]


def test_reservations_on_a_small_decode_pool_neither_hang_nor_leak(binaries, reference, tmp_path):
    # A decode pool of a few prompts' blocks and 24 long prompts at once: placement reserves
    # where blocks are free and proceeds without a reservation where none are (the hand-off then
    # waits for room, or goes to the prefill replica); every request finishes with its tokens and
    # every hold ends.
    indices = [i for i in range(1, 40) if i % 5 != 0 and not seeded(i)][:24]
    workers = {"prefill-0": {**COMMON, "role": "prefill"},
               "decode-0": {**COMMON, "role": "decode", "kv_cache_memory": "6MiB"}}
    with h.running_cluster(tmp_path, workers, max_local_prefill_length=THRESHOLD) as rig:
        status = wait_for(rig, lambda r: r["decode-0"].num_kv_blocks > 0, "decode-0's pool")
        assert status["decode-0"].num_kv_blocks < 24, status["decode-0"]  # smaller than the burst
        outcomes = h.generate_all(rig.coordinator.stub, [
            make_request(PROMPTS[i], max_tokens=FAILURE_TOKENS, ignore_eos=True) for i in indices], timeout=300)
        for i, outcome in zip(indices, outcomes):
            assert outcome.finished, outcome.describe()
            assert outcome.token_ids == reference[i][:FAILURE_TOKENS], (i, outcome.text)
        status = no_block_held(rig, ["decode-0", "prefill-0"])
        assert status["prefill-0"].num_handoffs_out > 0, status["prefill-0"]


def long_prompt(i: int) -> str:
    """Prompt i of the long ones: 600 to 900 tokens, no prefix shared with another."""
    words = [WORDS[(i * 3 + k * (i % 7 + 2)) % len(WORDS)] for k in range(500 + 40 * i)]
    return f"Chapter {i} of the long notes: " + " ".join(words) + "\nIn one line:"


LONG_PROMPTS = [long_prompt(i) for i in range(8)]
LONG_TOKENS = 4


@pytest.fixture(scope="module")
def long_reference(binaries, tmp_path_factory):
    """The long prompts' tokens on one mixed replica."""
    up = h.Up(tmp_path_factory.mktemp("mixed-long"), http_port=-1, **COMMON)
    try:
        up.wait_healthy(["replica-0"])
        outcomes = h.generate_all(up.stub, [make_request(p, max_tokens=LONG_TOKENS, ignore_eos=True)
                                            for p in LONG_PROMPTS], timeout=600)
        for outcome in outcomes:
            assert outcome.finished, outcome.describe()
        return [o.token_ids for o in outcomes]
    finally:
        up.stop()


@pytest.mark.slow_machine
@pytest.mark.parametrize("step_tokens", [1024, 512])
def test_a_prefill_replica_whose_first_token_would_come_later_is_passed_over(binaries, long_reference, tmp_path,
                                                                             step_tokens):
    # The threshold measured (no --max-local-prefill-length). Short prompts time the decode
    # replica's steps; the first long prompt goes to the prefill replica (nothing timed there
    # yet: sending is the default). Then a burst of long prompts queues on the prefill replica,
    # and with steps of 1,024 tokens those whose first token its queue would delay past the
    # decode replica's own prefill stay there, counted; with steps of 512 the long prompts
    # (600-900 tokens) are past one full step: kept local they would double the decodes' step
    # for hundreds of steps, so every one waits for the prefill replica. Each gives the mixed
    # replica's tokens.
    workers = {"prefill-0": {**COMMON, "role": "prefill"}, "decode-0": {**COMMON, "role": "decode"}}
    with h.running_cluster(tmp_path, workers, max_num_batched_tokens=step_tokens) as rig:
        stub = rig.coordinator.stub
        for outcome in h.generate_all(stub, [make_request(PROMPTS[i], max_tokens=FAILURE_TOKENS, ignore_eos=True)
                                             for i in range(5)], timeout=180):
            assert outcome.finished and outcome.replica_id == "decode-0", outcome.describe()
        first = h.generate_all(stub, [make_request(LONG_PROMPTS[0], max_tokens=LONG_TOKENS, ignore_eos=True)],
                               timeout=300)
        # Its KV was pushed: the hand-off cost the decode replica no wait, which counts as measured
        # (0 s), so its local limit follows its measured steps alone (it stayed at the unmeasured
        # 512 tokens, and the decode replica kept long prompts it should have sent away).
        status = rig.coordinator.wait_replicas(lambda r: r["decode-0"].num_handoffs_in == 1, 30,
                                               "the first hand-off admitted")
        assert status["decode-0"].num_handoffs_pushed == 1, status["decode-0"]
        assert 0 < status["decode-0"].local_prefill_limit < 512, status["decode-0"]
        # Its chunk beside decodes is never past that limit; the prefill replica's is a full step.
        assert 0 < status["decode-0"].prefill_chunk_tokens <= status["decode-0"].local_prefill_limit
        assert status["prefill-0"].prefill_chunk_tokens == step_tokens, status["prefill-0"]
        burst = h.generate_all(stub, [make_request(p, max_tokens=LONG_TOKENS, ignore_eos=True)
                                      for p in LONG_PROMPTS[1:]], timeout=600)
        for i, outcome in enumerate(first + burst):
            assert outcome.finished, outcome.describe()
            assert outcome.token_ids == long_reference[i], (i, outcome.text)
        assert first[0].replica_id == "prefill-0", first[0].describe()
        status = no_block_held(rig, ["decode-0", "prefill-0"])
        decode = status["decode-0"]
        kept = [o for o in burst if o.replica_id == "decode-0"]
        if step_tokens == 512:
            assert decode.num_prefills_kept_local == 0, decode
            assert status["prefill-0"].num_handoffs_out == len(LONG_PROMPTS), status["prefill-0"]
        else:
            assert decode.num_prefills_kept_local >= 1, decode
        assert len(kept) >= decode.num_prefills_kept_local, [o.replica_id for o in burst]
        assert status["prefill-0"].num_handoffs_out == decode.num_handoffs_in >= 1
