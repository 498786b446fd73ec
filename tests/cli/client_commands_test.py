"""`loom complete`, `loom models`, `loom status` and `loom chat` (cli/*_command.cc,
built on loom::client) against a running coordinator and worker on loopback.

* complete: greedy text equals `loom generate`'s, blocking and --stream; bad flags exit 2;
  an unreachable address exits 1 with UNAVAILABLE.
* models / status: the served model and the replica's row.
* chat: the first reply equals `loom generate --chat` (same chat template, greedy); the
  conversation goes on for a second turn; /exit quits.
"""
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
import cluster_harness as h  # noqa: E402

PROMPT = "The capital of France is"


def loom(*args, stdin: str = None, timeout: float = 180):
    return subprocess.run([str(h.LOOM_BIN), *map(str, args)], input=stdin, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    with h.running_cluster(h.cluster_log_dir(tmp_path_factory, "client_commands"), {"r0": {"threads": 1}}) as rig:
        yield rig


@pytest.mark.parametrize("stream", [False, True])
def test_complete_prints_the_greedy_completion(rig, stream):
    reference = h.loom_generate(PROMPT, 16, threads=1).text
    done = loom("complete", "--address", rig.coordinator.address, "--max-tokens", 16,
                *(["--stream"] if stream else []), PROMPT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == reference + "\n"
    assert "finish: " in done.stderr and "completion tokens: " in done.stderr


def test_complete_reports_bad_flags_and_unreachable_servers():
    assert loom("complete", "--temperature", "warm", "hi").returncode == 2
    assert loom("complete").returncode == 2
    done = loom("complete", "--address", "127.0.0.1:1", "--timeout", "5", "hi")
    assert done.returncode == 1
    assert "UNAVAILABLE" in done.stderr


def test_models_lists_the_served_model(rig):
    done = loom("models", "--address", rig.coordinator.address)
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()
    assert header.split()[:4] == ["ID", "ARCH", "VOCAB", "CONTEXT"]
    assert row.split()[:3] == [h.MODEL_PATH.stem, "llama", "49152"]


def test_status_shows_the_replica(rig):
    rig.coordinator.wait_idle()
    done = loom("status", "--address", rig.coordinator.address)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"model: {h.MODEL_PATH.stem}"
    assert lines[1].startswith("replicas: 1 healthy of 1")
    row = next(line for line in lines if line.startswith("r0 "))
    fields = row.split()
    assert fields[1] == "healthy"
    free, total = map(int, fields[4].split("/"))
    assert free == total > 0


def test_chat_reply_equals_loom_generate_chat_and_keeps_the_conversation(rig):
    question = "What is the capital of France?"
    reference = subprocess.run([str(h.LOOM_BIN), "generate", "--model", str(h.MODEL_PATH), "--chat",
                                "--prompt", question, "--max-tokens", "24", "--threads", "1"],
                               capture_output=True, text=True, timeout=180)
    assert reference.returncode == 0, reference.stderr
    done = loom("chat", "--address", rig.coordinator.address, "--model", h.MODEL_PATH, "--max-tokens", 24,
                stdin=f"{question}\nAnd of Italy?\n/exit\nnever read\n")
    assert done.returncode == 0, done.stderr
    replies = done.stdout.split("\n")
    assert replies[0] + "\n" == reference.stdout
    assert replies[1].strip()  # a second turn was answered
    assert replies[2:] == [""]  # /exit stopped it
