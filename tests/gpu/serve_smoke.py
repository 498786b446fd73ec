#!/usr/bin/env python3
"""Serving smoke test: `loom up MODEL --device DEVICE` answers real HTTP requests, every
answer checked, then drains on SIGTERM.

It runs on the GPU machine (tests/gpu/quick.sh, `--device cuda`, with only the Python
standard library; the official `openai` client is used for the chat request when it is
installed) and here on the CPU (tests/gpu/serve_smoke_test.py), so the script itself is
tested on every CI run. Steps, each a check:

1. start: `loom up` with the default KV sizing, ready within --start-timeout;
2. a non-streaming and a streaming greedy /v1/completions of the same prompt: same text,
   `usage` agreeing with the tokens, finish_reason, ids and object names;
3. /v1/chat/completions (openai client if importable, else raw HTTP);
4. --concurrency streams at once, each complete ([DONE], max_tokens tokens, one id);
5. the worker's CUDA graph replays (--expect-graph-replays: more than zero);
6. a ~90-token greedy prompt, whose text step 7 compares;
7. SIGTERM while a long stream runs: the stream finishes with all its tokens and `loom up`
   exits 0;
8. (--pd, after a start that passed, when --budget-s leaves 15 s + two request timeouts)
   disaggregated serving: `loom up --prefill-replicas 1
   --decode-replicas 1` on the same device (each worker its share of it), the long prompt
   prefilled on the prefill replica, its KV moved to the decode replica (pushed into its host
   tier, or on a GPU copied pool to pool through CUDA IPC) and decoded there: the text of
   step 6, the hand-off counted as pushed or pool to pool, not recomputed.
9. (--draft, likewise) speculative decoding with a draft model: `loom up --draft-model` the
   served model itself, 3 drafts a step: the text of step 6, drafts proposed and accepted.

Writes a JSON summary to --out (one entry per step: passed / failed with the reason /
skipped) and exits 1 when any step failed.
"""
import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
# Past --max-local-prefill-length 16 of the disaggregated run: prefilled on its prefill replica.
LONG_PROMPT = " ".join(f"{PROMPT} (part {i})." for i in range(6))


class CheckFailed(Exception):
    pass


def exit_on_sigterm():
    """SIGTERM (`timeout` at a step's limit) raises SystemExit, so that `finally` blocks stop
    the server and write the summary; Python's default would end the process at once."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def check(condition, message):
    if not condition:
        raise CheckFailed(message)


def child_environment():
    """The environment of the Loom processes started here: LOOM_CHILD_LD_LIBRARY_PATH, when
    set, becomes their LD_LIBRARY_PATH (quick.sh points it at the bundle's libraries, which
    must not shadow this Python's own, PyTorch's included)."""
    env = dict(os.environ)
    if os.environ.get("LOOM_CHILD_LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["LOOM_CHILD_LD_LIBRARY_PATH"]
    return env


class Server:
    """`loom up` with its output collected; the HTTP URL and the worker's metrics URL
    come from its startup lines."""

    def __init__(self, args, log_path, pgid_file=None):
        self.log = open(log_path, "w")
        self.lines = []
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, start_new_session=True,
                                        env=child_environment())
        # Its session's process group, for a caller that must kill it should this script be
        # killed first (quick.sh after a step's time limit).
        if pgid_file:
            with open(pgid_file, "w") as f:
                f.write(str(self.process.pid))
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self):
        for line in self.process.stdout:
            self.lines.append(line)
            self.log.write(line)
            self.log.flush()

    def wait_for(self, pattern, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                match = re.search(pattern, line)
                if match:
                    return match
            if self.process.poll() is not None:
                raise CheckFailed(f"loom up exited ({self.process.returncode}) before "
                                  f"{pattern!r}: {''.join(self.lines[-20:])}")
            time.sleep(0.05)
        raise CheckFailed(f"no {pattern!r} within {timeout} s: {''.join(self.lines[-20:])}")

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.reader.join(timeout=5)
        self.log.close()


def post(url, body, timeout):
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            check(response.headers.get("Content-Type", "").startswith("application/json"),
                  f"{url}: Content-Type {response.headers.get('Content-Type')}")
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise CheckFailed(f"{url}: HTTP {error.code}: {error.read()[:500]!r}")


def stream(base_url, path, body, timeout, on_event=None):
    """POSTs a streaming request; returns the parsed `data:` events, checking the SSE framing
    and the final [DONE]. `on_event` is called with each event as it arrives."""
    host, port = re.match(r"https?://([^:/]+):(\d+)", base_url).groups()
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    connection.request("POST", "/v1" + path, body=json.dumps({**body, "stream": True}),
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise CheckFailed(f"{path} stream: HTTP {response.status}: {response.read()[:500]!r}")
    check(response.getheader("Content-Type", "").startswith("text/event-stream"),
          f"{path} stream: Content-Type {response.getheader('Content-Type')}")
    events, done = [], False
    for raw in response:
        line = raw.decode().rstrip("\r\n")
        if not line:
            continue
        check(line.startswith("data: "), f"{path} stream: not an SSE data line: {line[:200]!r}")
        check(not done, f"{path} stream: data after [DONE]")
        payload = line[len("data: "):]
        if payload == "[DONE]":
            done = True
            continue
        events.append(json.loads(payload))
        if on_event is not None:
            on_event(events[-1])
    connection.close()
    check(done, f"{path} stream: no [DONE] after {len(events)} events")
    return events


def check_completion(body, max_tokens, what):
    check(body.get("object") == "text_completion", f"{what}: object {body.get('object')!r}")
    check(str(body.get("id", "")).startswith("cmpl-"), f"{what}: id {body.get('id')!r}")
    choices = body.get("choices") or []
    check(len(choices) == 1, f"{what}: {len(choices)} choices")
    choice = choices[0]
    check(choice.get("finish_reason") == "length", f"{what}: finish_reason {choice.get('finish_reason')!r}")
    usage = body.get("usage") or {}
    check(usage.get("completion_tokens") == max_tokens,
          f"{what}: usage.completion_tokens {usage.get('completion_tokens')} for max_tokens {max_tokens}")
    check(usage.get("prompt_tokens", 0) > 0, f"{what}: usage.prompt_tokens {usage.get('prompt_tokens')}")
    check(usage.get("total_tokens") == usage["prompt_tokens"] + usage["completion_tokens"],
          f"{what}: usage.total_tokens {usage.get('total_tokens')}")
    return choice.get("text", "")


def streamed_completion(base_url, body, timeout, what, on_event=None):
    """One streaming /v1/completions: (text, number of content events), every event checked."""
    events = stream(base_url, "/completions", {**body, "stream_options": {"include_usage": True}},
                    timeout, on_event)
    ids = {event.get("id") for event in events}
    check(len(ids) == 1, f"{what}: {len(ids)} ids in one stream")
    text, finish, usage, content_events = "", None, None, 0
    for event in events:
        check(event.get("object") == "text_completion", f"{what}: event object {event.get('object')!r}")
        if event.get("usage"):
            usage = event["usage"]
        for choice in event.get("choices") or []:
            if choice.get("text"):
                content_events += 1
            text += choice.get("text") or ""
            finish = choice.get("finish_reason") or finish
    check(finish == "length", f"{what}: finish_reason {finish!r}")
    check(usage is not None and usage.get("completion_tokens") == body["max_tokens"],
          f"{what}: usage {usage} for max_tokens {body['max_tokens']}")
    return text, content_events


def step_completions(base_url, model, timeout):
    body = {"model": model, "prompt": PROMPT, "max_tokens": 24, "temperature": 0,
            "ignore_eos": True}
    text = check_completion(post(base_url + "/completions", body, timeout), 24, "completion")
    streamed, content_events = streamed_completion(base_url, body, timeout, "streamed completion")
    check(streamed == text, f"greedy stream {streamed!r} differs from the plain answer {text!r}")
    check(content_events >= 1, "streamed completion: no content event")
    return {"text": text, "content_events": content_events}


def step_chat(base_url, model, timeout):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name three colours."}]
    try:
        import openai  # noqa: PLC0415 (optional on the GPU machine)
    except ImportError:
        openai = None
    if openai is not None:
        client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=timeout)
        answer = client.chat.completions.create(model=model, messages=messages, max_tokens=16,
                                                temperature=0, extra_body={"ignore_eos": True})
        body = answer.model_dump()
        via = f"openai {openai.__version__}"
    else:
        body = post(base_url + "/chat/completions",
                    {"model": model, "messages": messages, "max_tokens": 16, "temperature": 0,
                     "ignore_eos": True}, timeout)
        via = "raw HTTP (no openai module)"
    check(body.get("object") == "chat.completion", f"chat: object {body.get('object')!r}")
    check(str(body.get("id", "")).startswith("chatcmpl-"), f"chat: id {body.get('id')!r}")
    choice = (body.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    check(message.get("role") == "assistant", f"chat: role {message.get('role')!r}")
    check(isinstance(message.get("content"), str), f"chat: content {message.get('content')!r}")
    check(choice.get("finish_reason") == "length", f"chat: finish_reason {choice.get('finish_reason')!r}")
    check((body.get("usage") or {}).get("completion_tokens") == 16, f"chat: usage {body.get('usage')}")
    return {"via": via, "content": message["content"]}


def step_concurrent(base_url, model, timeout, concurrency):
    def one(i):
        body = {"model": model, "prompt": f"{PROMPT} {i}", "max_tokens": 32, "temperature": 0,
                "ignore_eos": True}
        return streamed_completion(base_url, body, timeout, f"stream {i}")

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, range(concurrency)))
    seconds = time.monotonic() - started
    return {"streams": len(results), "seconds": round(seconds, 3),
            "output_tokens_per_s": round(concurrency * 32 / seconds, 1)}


def metric_total(metrics_url, name, timeout):
    with urllib.request.urlopen(metrics_url, timeout=timeout) as response:
        text = response.read().decode()
    values = [float(line.split()[-1]) for line in text.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    return sum(values) if values else None


def step_graphs(metrics_url, timeout, expect):
    found = {name: metric_total(metrics_url, name, timeout)
             for name in ("loom_worker_cuda_graph_replays_total",
                          "loom_worker_cuda_graph_captures_total", "loom_worker_steps_total")}
    check(found["loom_worker_steps_total"], f"worker metrics without steps: {found}")
    if expect:
        check(found["loom_worker_cuda_graph_replays_total"],
              f"no CUDA graph replays after the concurrent streams: {found}")
    return found


def step_long_prompt(base_url, model, timeout, found):
    body = {"model": model, "prompt": LONG_PROMPT, "max_tokens": 8, "temperature": 0,
            "ignore_eos": True}
    found["long"] = check_completion(post(base_url + "/completions", body, timeout), 8,
                                     "long prompt")
    return {"text": found["long"]}


def pd_flags(device):
    """One prefill and one decode replica on one device: on a GPU each worker takes its share
    (loom up refuses two workers on one GPU otherwise), and the hand-off tier stays small."""
    flags = ["--prefill-replicas", "1", "--decode-replicas", "1", "--max-local-prefill-length",
             "16", "--kv-offload-memory", "256MiB"]
    return flags + (["--gpu-memory-utilization", "0.3"] if device == "cuda"
                    else ["--kv-cache-memory", "64MiB"])


def metric_value(text, name, **labels):
    """The first sample of `name` whose labels include `labels`, or None."""
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.split()[-1])
    return None


def wait_for_replicas(server, start_timeout, replicas):
    """The base URL of `server` once every one of `replicas` is registered and healthy."""
    deadline = time.monotonic() + start_timeout
    base_url = server.wait_for(r"OpenAI-compatible HTTP API on (\S+)",
                               deadline - time.monotonic()).group(1).rstrip("/")
    while True:
        try:
            with urllib.request.urlopen(base_url + "/metrics", timeout=5) as response:
                text = response.read().decode()
            if all(metric_value(text, "loom_replica_up", replica=r) == 1 for r in replicas):
                return base_url
        except (urllib.error.URLError, ConnectionError):
            pass
        check(time.monotonic() < deadline,
              f"{' and '.join(replicas)} not up within {start_timeout} s: "
              f"{''.join(server.lines[-10:])}")
        time.sleep(0.2)


def step_pd(command, log_path, pgid_file, model, timeout, start_timeout, reference):
    """`command` with one prefill and one decode replica: the long prompt is handed off with
    its KV moved, not recomputed (pushed into the decode worker's host tier, or, where both
    workers' pools are shared on one machine as CUDA pools are through IPC, copied pool to
    pool), and gives the text the mixed server gave (`reference`)."""
    server = Server(command, log_path, pgid_file)
    try:
        base_url = wait_for_replicas(server, start_timeout, ("prefill-0", "decode-0"))
        body = {"model": model, "prompt": LONG_PROMPT, "max_tokens": 8, "temperature": 0,
                "ignore_eos": True}
        text = check_completion(post(base_url + "/v1/completions", body, timeout), 8,
                                "disaggregated long prompt")
        with urllib.request.urlopen(base_url + "/metrics", timeout=timeout) as response:
            metrics = response.read().decode()
        handoffs = metric_value(metrics, "loom_disagg_handoffs_total", direction="out",
                                replica="prefill-0")
        pushed = metric_value(metrics, "loom_disagg_handoffs_pushed_total", replica="decode-0") or 0
        pooled = metric_value(metrics, "loom_kv_pool_fetches_total", replica="decode-0") or 0
        check(handoffs == 1, f"{handoffs} hand-offs out of prefill-0 for the long prompt")
        check(pushed + pooled == 1,
              f"the hand-off's KV was neither pushed nor copied pool to pool ({pushed} pushed, "
              f"{pooled} pool to pool): see the log")
        check(reference is None or text == reference,
              f"disaggregated text {text!r} differs from the mixed server's {reference!r}")
        return {"text": text, "handoffs": handoffs, "pushed": pushed, "pool_to_pool": pooled,
                "transport": "pushed" if pushed else "pool to pool"}
    finally:
        server.stop()


DRAFT_FLAGS = ["--speculative-tokens", "3", "--speculative-adaptive", "off"]


def step_draft(command, log_path, pgid_file, model, timeout, start_timeout, reference):
    """`command` with the served model drafting for itself (`--draft-model`, 3 drafts every
    step): on a GPU the draft is a second forward pass on the device, its KV pool sized
    beside the target's. The long prompt gives the text the server without drafts gave
    (`reference`: greedy speculation is lossless), with drafts proposed and accepted. Then a
    sampled completion (temperature 0.8): the draft model's distributions go through the
    rejection sampling (on a GPU, the device's), and drafts are accepted there too."""
    server = Server(command, log_path, pgid_file)
    try:
        base_url = wait_for_replicas(server, start_timeout, ("replica-0",))
        body = {"model": model, "prompt": LONG_PROMPT, "max_tokens": 8, "temperature": 0,
                "ignore_eos": True}
        text = check_completion(post(base_url + "/v1/completions", body, timeout), 8,
                                "long prompt with drafts")
        drafted = metric_total(base_url + "/metrics", "loom_spec_decode_num_draft_tokens_total",
                               timeout)
        accepted = metric_total(base_url + "/metrics",
                                "loom_spec_decode_num_accepted_tokens_total", timeout)
        check(drafted is not None and drafted > 0, f"no draft proposed ({drafted}): see the log")
        check(accepted is not None and accepted > 0,
              f"none of {drafted} drafts accepted (the model drafting for itself)")
        check(reference is None or text == reference,
              f"text with drafts {text!r} differs from the server's without {reference!r}")
        sampled = dict(body, temperature=0.8, seed=7)
        check_completion(post(base_url + "/v1/completions", sampled, timeout), 8,
                         "sampled long prompt with drafts")
        after = metric_total(base_url + "/metrics", "loom_spec_decode_num_accepted_tokens_total",
                             timeout)
        check(after is not None and after > accepted,
              f"no draft accepted under sampling ({accepted} before, {after} after)")
        return {"text": text, "drafted": drafted, "accepted": accepted,
                "sampled_accepted": after - accepted}
    finally:
        server.stop()


def step_drain(server, base_url, model, timeout):
    """SIGTERM to `loom up` while a long stream runs: the stream must finish whole, and
    `loom up` exit 0 once it has."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 1500, "temperature": 0,
            "ignore_eos": True}
    outcome = {}
    first_event = threading.Event()

    def run():
        try:
            outcome["result"] = streamed_completion(base_url, body, timeout, "draining stream",
                                                    lambda event: first_event.set())
        except Exception as error:  # reported below, in the main thread
            outcome["error"] = error
        outcome["ended"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    check(first_event.wait(timeout), f"no event of the long stream within {timeout} s")
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    thread.join(timeout)
    check(not thread.is_alive(), f"the stream did not end within {timeout} s of SIGTERM")
    if "error" in outcome:
        raise CheckFailed(f"the running stream was cut by the drain: {outcome['error']}")
    try:
        code = server.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"loom up still running {timeout} s after SIGTERM")
    exited = time.monotonic()
    check(code == 0, f"loom up exited {code} after SIGTERM")
    return {"exit_code": code, "stream_after_sigterm_s": round(outcome["ended"] - signalled, 3),
            "exit_after_stream_s": round(exited - outcome["ended"], 3)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loom", required=True, help="the loom binary")
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--expect-graph-replays", action="store_true")
    parser.add_argument("--start-timeout", type=float, default=120)
    parser.add_argument("--timeout", type=float, default=60, help="per request")
    parser.add_argument("--log", default="serve_smoke.log")
    parser.add_argument("--out", default="serve_smoke.json")
    parser.add_argument("--pgid-file", help="where to write the process group of `loom up`")
    parser.add_argument("--pd", action="store_true",
                        help="then serve disaggregated (prefill and decode replicas)")
    parser.add_argument("--draft", action="store_true",
                        help="then serve with the model drafting for itself (--draft-model)")
    parser.add_argument("--budget-s", type=float, default=0,
                        help="the script's whole time (0: none): --pd and --draft each run if "
                             "15 s + two --timeout are left")
    parser.add_argument("extra", nargs="*", help="more `loom up` flags (after --)")
    args = parser.parse_args()
    exit_on_sigterm()

    command = [args.loom, "up", args.model, "--device", args.device, "--host", "127.0.0.1",
               "--port", "0", "--grpc-port", "0", "--metrics-port", "0",
               "--served-model-name", "smoke", "--drain-timeout-s", "60", *args.extra]
    summary = {"command": command, "steps": {}}
    server = Server(command, args.log, args.pgid_file)
    steps = summary["steps"]

    began = time.monotonic()

    def save():  # after every step: a run killed later keeps what it found
        summary["passed"] = all(step["status"] in ("passed", "skipped") for step in steps.values())
        with open(args.out + ".tmp", "w") as out:
            json.dump(summary, out, indent=2)
        os.replace(args.out + ".tmp", args.out)

    def run(name, function, *function_args):
        started = time.monotonic()
        try:
            steps[name] = {"status": "passed", **(function(*function_args) or {})}
        except Exception as error:  # every failure is reported, the next step still runs
            steps[name] = {"status": "failed", "reason": f"{type(error).__name__}: {error}"}
        except BaseException as error:  # killed at the step's limit: say where, then go
            steps[name] = {"status": "failed",
                           "reason": f"killed while running ({type(error).__name__})",
                           "seconds": round(time.monotonic() - started, 3)}
            save()
            raise
        steps[name]["seconds"] = round(time.monotonic() - started, 3)
        print(f"serve_smoke: {name}: {steps[name]['status']} "
              f"{steps[name].get('reason', '')}".rstrip(), flush=True)
        save()
        return steps[name]["status"] == "passed"

    urls, found = {}, {}

    def start():
        # One deadline for the whole start, not one per line awaited.
        deadline = time.monotonic() + args.start_timeout
        urls["http"] = server.wait_for(r"OpenAI-compatible HTTP API on (\S+)",
                                       deadline - time.monotonic()).group(1).rstrip("/") + "/v1"
        urls["metrics"] = server.wait_for(r"loom-worker: metrics on (\S+)",
                                          deadline - time.monotonic()).group(1)
        while True:  # ready: a replica registered and healthy
            try:
                with urllib.request.urlopen(urls["http"][:-3] + "/ready", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            check(time.monotonic() < deadline, f"not ready within {args.start_timeout} s")
            time.sleep(0.1)
        loaded = [line.strip() for line in server.lines if "KV" in line or "device" in line.lower()]
        return {"http": urls["http"], "load_lines": loaded[-6:]}

    try:
        if run("start", start):
            run("completions", step_completions, urls["http"], "smoke", args.timeout)
            run("chat", step_chat, urls["http"], "smoke", args.timeout)
            run("concurrent", step_concurrent, urls["http"], "smoke", args.timeout, args.concurrency)
            run("graphs", step_graphs, urls["metrics"], args.timeout, args.expect_graph_replays)
            run("long_prompt", step_long_prompt, urls["http"], "smoke", args.timeout, found)
            run("drain", step_drain, server, urls["http"], "smoke", args.timeout)
        server.stop()
        # Each further server: a start, one request and the metrics read must fit what is
        # left (the start gets all the rest: two CUDA workers start one after the other).
        for name, wanted, function, flags in (
                ("pd", args.pd, step_pd, pd_flags(args.device)),
                ("draft", args.draft, step_draft, ["--draft-model", args.model, *DRAFT_FLAGS])):
            if not wanted or steps.get("start", {}).get("status") != "passed":
                continue
            left = args.budget_s - (time.monotonic() - began) if args.budget_s > 0 else None
            if left is not None and left < 15 + 2 * args.timeout:
                steps[name] = {"status": "skipped", "reason": f"{left:.0f} s of the budget left"}
                continue
            log = os.path.splitext(args.log)[0] + f"_{name}.log"
            run(name, function, command + flags, log, args.pgid_file, "smoke", args.timeout,
                min(args.start_timeout, (left or 1e9) - args.timeout - 10), found.get("long"))
    finally:
        server.stop()
        save()
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
