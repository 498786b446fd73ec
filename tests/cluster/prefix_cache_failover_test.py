"""The prefix cache survives a coordinator failover (issue 39), over real processes and the
real model: two `loom serve --leader-lock` coordinators and one CPU `loom-worker` listing both.

The leader serves prompts that share a long prefix, twice (the second pass measures the hit
rate), with one tenant's prompt under a cache salt. The leader is then killed (SIGKILL). The
worker, not restarted, registers with the new leader and reports the KV blocks its pool still
holds; the new leader adopts them (its log says how many). The same prompts then hit at least
as many cached tokens as before the failover, their greedy completions are the same text (the
adopted K/V are the right ones), the salted prompt hits only under its own salt, and no KV
block stays in use.
"""
import json
import re
import urllib.request

import pytest

import cluster_harness as h

# Outcomes that rest on time: scripts/test-slow-machine.sh runs them again on one core.
pytestmark = pytest.mark.slow_machine

TIMEOUT_S = 120
SHARED = ("You are a careful assistant for a library. Answer in one short sentence, using plain "
          "words, and never invent a title or an author that the catalogue does not list. If a "
          "reader asks about opening hours, rooms, loans or repairs, say which desk can help, and "
          "keep every answer polite, brief and free of guesses about the collection. ")
QUESTIONS = ["Where are the maps kept?", "When does the reading room open?",
             "Can I borrow a rare book?", "Who repairs damaged bindings?"]


def complete(coordinator, prompt: str, salt: str = "") -> dict:
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0}
    if salt:
        body["cache_salt"] = salt
    request = urllib.request.Request(
        coordinator.http_url.split("/v1")[0] + "/v1/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        answer = json.loads(response.read())
    usage = answer["usage"]
    return {"text": answer["choices"][0]["text"], "prompt": usage["prompt_tokens"],
            "cached": usage["prompt_tokens_details"]["cached_tokens"]}


def serve_all(coordinator) -> tuple[list[dict], float]:
    """Every question (sequentially: each finds the ones before it cached) and the hit rate."""
    answers = [complete(coordinator, SHARED + question) for question in QUESTIONS]
    return answers, sum(a["cached"] for a in answers) / sum(a["prompt"] for a in answers)


def test_cached_prefixes_still_hit_after_the_leader_dies(tmp_path):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    processes = []
    try:
        a, b = h.leader_and_standby(tmp_path, processes, TIMEOUT_S)
        worker = h.Worker(tmp_path, f"{a.address},{b.address}", "replica-a",
                          kv_cache_memory="256MiB")
        processes.append(worker)
        a.wait_healthy(["replica-a"], timeout=TIMEOUT_S)

        serve_all(a)
        before, hit_before = serve_all(a)
        salted = complete(a, SHARED + "Is there a quiet room?", salt="tenant-a")
        assert complete(a, SHARED + "Is there a quiet room?", salt="tenant-a")["cached"] > 0
        print(f"hit rate before the failover: {hit_before:.3f}")
        assert hit_before > 0.5, before

        worker_pid = worker.pid
        a.kill()
        b.wait_for_line(r"loom: leading", TIMEOUT_S)
        b.wait_healthy(["replica-a"], timeout=TIMEOUT_S)
        # Printed before the replica connects (stderr, the log).
        adopted = re.search(r"adopted (\d+) of the (\d+) cached KV blocks", b.log_path.read_text())
        assert adopted, b.log_tail()
        # Not all: a block recomputed beside its cached copy (the block of a prompt's last
        # token, with the same greedy output after it) is a duplicate, kept uncached.
        assert int(adopted.group(1)) > 0, adopted.group(0)
        assert worker.alive() and worker.pid == worker_pid

        after, hit_after = serve_all(b)
        print(f"hit rate after the failover: {hit_after:.3f} ({adopted.group(1)} blocks adopted)")
        assert hit_after >= hit_before, (before, after)
        assert [x["text"] for x in after] == [x["text"] for x in before]
        # The salt stays part of the key: another tenant (or none) shares nothing of it
        # beyond what it computed itself.
        unsalted = complete(b, SHARED + "Is there a quiet room?")
        other = complete(b, SHARED + "Is there a quiet room?", salt="tenant-b")
        assert other["cached"] == 0, other
        again = complete(b, SHARED + "Is there a quiet room?", salt="tenant-a")
        assert again["cached"] >= salted["cached"] and again["cached"] > 0, again
        assert again["text"] == salted["text"] == unsalted["text"]

        b.wait_idle(timeout=TIMEOUT_S)
        replica = b.replicas()["replica-a"]
        assert replica.num_kv_blocks - replica.num_free_blocks == 0
        assert not re.search(r"Check failed|Segmentation", worker.log_tail(20000))
    finally:
        h.stop_all(processes)
