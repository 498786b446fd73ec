"""Counters move while requests run, as vLLM's do per engine step: a scripted workload of
long requests is paused in the middle (the worker is SIGSTOPped, so the coordinator has
nothing more to apply: the coordinator's heartbeat and step timeouts are raised for that),
and then, with every request still running, the coordinator's /metrics must show exactly
the tokens the clients have received so far, the prompt tokens and TTFT of every request
that produced a token, and each prompt's prefix-cache lookup; no request is counted as
finished. Then the worker continues and the totals match the finished workload.

Speed-independent: the pause is a control-flow point (no step can run), and the checks
wait for the coordinator and the clients to agree (the tokens already computed when the
worker stopped arrive at both)."""
import pathlib
import re
import signal
import sys
import time
import urllib.request

import pytest

# Outcomes that rest on time: scripts/test-slow-machine.sh runs them again on one core.
pytestmark = pytest.mark.slow_machine

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
import cluster_harness as h  # noqa: E402
from cluster_harness import make_request  # noqa: E402

MAX_TOKENS = 300  # far more than the few tokens before the pause
NUM_REQUESTS = 3


def scrape(coordinator) -> str:
    with urllib.request.urlopen(f"{coordinator.http_url}/metrics", timeout=10) as response:
        return response.read().decode()


def value(text: str, name: str, **labels) -> float:
    """The sum of the series `name` whose labels include `labels` (0 when there is none)."""
    total = 0.0
    for match in re.finditer(rf"^{name}(\{{[^}}]*\}})?\s+(\S+)$", text, re.M):
        series = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(series.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total


def test_token_counters_equal_the_tokens_streamed_while_requests_run(tmp_path):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    with h.ClusterRig(tmp_path, http_port=0, heartbeat_timeout_ms=600000,
                      step_timeout_ms=600000) as rig:
        coordinator = rig.coordinator
        worker = rig.add_worker("r0", threads=1)
        prompts = list(h.TEXT_PROMPTS[1:1 + NUM_REQUESTS])
        streams = [h.Stream(coordinator.stub, make_request(p, max_tokens=MAX_TOKENS, ignore_eos=True), 600)
                   for p in prompts]
        for stream in streams:
            assert stream.wait_tokens(2, timeout=120), stream.outcome.describe()
        worker.signal(signal.SIGSTOP)
        try:
            # Agreement: the clients' token count is the same before and after a scrape
            # whose counter equals it.
            deadline = time.monotonic() + 60
            while True:
                before = sum(len(s.outcome.token_ids) for s in streams)
                text = scrape(coordinator)
                after = sum(len(s.outcome.token_ids) for s in streams)
                counted = value(text, "loom_generation_tokens_total")
                if before == after == counted:
                    break
                assert time.monotonic() < deadline, (
                    f"loom_generation_tokens_total is {counted} while the clients have received "
                    f"{after} tokens of requests still running")
                time.sleep(0.1)
            assert not any(s.done() for s in streams), "a request ended during the pause"
            assert counted >= 2 * NUM_REQUESTS and counted < NUM_REQUESTS * MAX_TOKENS
            # Every request has its first token: its prompt (checked below against the
            # lengths the final messages report) and TTFT are counted, on r0.
            paused_prompt_tokens = value(text, "loom_prompt_tokens_total")
            paused_prefix_queries = value(text, "loom_prefix_cache_queries_total", replica="r0")
            assert value(text, "loom_time_to_first_token_seconds_count", replica="r0") == NUM_REQUESTS
            # Gaps after each request's first token.
            assert value(text, "loom_inter_token_latency_seconds_count", replica="r0") == \
                counted - NUM_REQUESTS
            # Nothing finished yet.
            assert value(text, "loom_request_success_total") == 0
            assert value(text, "loom_e2e_request_latency_seconds_count") == 0
            assert value(text, "loom_num_requests_running", replica="r0") == NUM_REQUESTS
        finally:
            worker.signal(signal.SIGCONT)
        prompt_lengths = []
        for stream in streams:
            outcome = stream.join()
            assert outcome.finished and len(outcome.token_ids) == MAX_TOKENS, outcome.describe()
            prompt_lengths.append(outcome.prompt_tokens)
        assert paused_prompt_tokens == sum(prompt_lengths) > 0
        # Each prompt was looked up when r0 scheduled it, before the pause.
        assert paused_prefix_queries == sum(prompt_lengths)
        text = scrape(coordinator)
        assert value(text, "loom_generation_tokens_total") == NUM_REQUESTS * MAX_TOKENS
        assert value(text, "loom_request_success_total", finished_reason="length") == NUM_REQUESTS
        assert value(text, "loom_prompt_tokens_total") == sum(prompt_lengths)
        assert value(text, "loom_request_time_per_output_token_seconds_count", replica="r0") == NUM_REQUESTS
        assert value(text, "loom_request_inference_time_seconds_count", replica="r0") == NUM_REQUESTS
        assert value(text, "loom_request_params_max_tokens_count") == NUM_REQUESTS
        assert value(text, "loom_request_params_n_sum") == NUM_REQUESTS
        assert value(text, "loom_request_max_num_generation_tokens_sum") == NUM_REQUESTS * MAX_TOKENS
        assert value(text, "process_start_time_seconds") > 0
        assert value(text, "process_resident_memory_bytes") > 0
        info = re.search(r'^loom_cache_config_info\{([^}]*)\} 1$', text, re.M)
        assert info, text
        labels = dict(re.findall(r'(\w+)="([^"]*)"', info.group(1)))
        assert labels["block_size"] == "16" and labels["cache_dtype"] in ("f16", "f32")
        assert int(labels["num_gpu_blocks"]) == coordinator.replicas()["r0"].num_kv_blocks


def test_rejected_requests_are_counted_by_reason(tmp_path):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    with h.ClusterRig(tmp_path, http_port=0) as rig:
        coordinator = rig.coordinator
        # No replica yet: 503 / UNAVAILABLE.
        outcome = h.generate(coordinator.stub, make_request("Hello", max_tokens=2), timeout=30)
        assert outcome.code.name == "UNAVAILABLE", outcome.describe()
        text = scrape(coordinator)
        assert value(text, "loom_request_rejected_total", reason="unavailable") == 1
        assert value(text, "loom_request_rejected_total", reason="queue_full") == 0
