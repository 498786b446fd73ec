"""Every `loom` subcommand and `loom-worker` on the one parser (cli/command_line.h), as
processes: --help lists the flags with their defaults and LOOM_* names; bad values (not a
number, a fraction for an integer, out of range, unknown flag) print one line and exit 2;
`loom up` forwards worker flags from the command line, the environment and a config file
with command line > environment > file; --max-model-len is checked where it can fail."""
import os
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
import cluster_harness as h  # noqa: E402

# Each command with the arguments it needs to get past "required" and one integer flag.
COMMANDS = {
    "serve": (["loom", "serve", "M"], "--max-num-seqs"),
    "up": (["loom", "up", "M"], "--tensor-parallel-size"),
    "generate": (["loom", "generate", "M", "--prompt", "x"], "--max-tokens"),
    "perplexity": (["loom", "perplexity", "M", "--text", "t"], "--context"),
    "quantize": (["loom", "quantize", "M", "--out", "o", "--format", "int8"], "--group-size"),
    "bench": (["loom", "bench"], "--num-requests"),
    "complete": (["loom", "complete", "hi"], "--max-tokens"),
    "chat": (["loom", "chat"], "--max-tokens"),
    "worker": (["loom-worker", "--model", "M", "--coordinator", "127.0.0.1:1"], "--block-size"),
}
OTHERS = [["loom", "models"], ["loom", "status"], ["loom", "inspect"], ["loom", "tokenize"],
          ["loom", "detokenize"]]


def run(argv, env=None, timeout=60):
    binary = h.WORKER_BIN if argv[0] == "loom-worker" else h.LOOM_BIN
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([str(binary), *argv[1:]], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


@pytest.fixture(scope="module", autouse=True)
def binaries():
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)


@pytest.mark.parametrize("argv", [c[0] for c in COMMANDS.values()] + OTHERS,
                         ids=[*COMMANDS, *(o[1] for o in OTHERS)])
def test_help_lists_every_flag_with_its_default_and_environment_name(argv):
    done = run([argv[0], *argv[1:2], "--help"] if argv[0] == "loom" else [argv[0], "--help"])
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.lstrip().startswith("--")]
    assert len(lines) >= 2, done.stdout
    for line in lines:
        name = line.split()[0].split(",")[0]
        if name in ("--config",):
            continue
        env = "LOOM_" + name[2:].upper().replace("-", "_")
        assert env in line, line
        # An option shows `=default`; a boolean says (default: on|off) in its description.
        block = done.stdout[done.stdout.index(line):].split("\n  -")[0]
        assert "=" in line or "(default" in block, block


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("form", ["space", "equals"])
@pytest.mark.parametrize("value, problem", [("abc", "not an integer"),
                                            ("1.5", "not an integer"),
                                            ("1e3", "not an integer"),
                                            ("99999999999", "out of range")])
def test_bad_values_print_one_line_and_exit_2(command, form, value, problem):
    argv, flag = COMMANDS[command]
    args = [*argv, flag, value] if form == "space" else [*argv, f"{flag}={value}"]
    done = run(args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert flag in done.stderr and problem in done.stderr and "usage" in done.stderr, done.stderr


@pytest.mark.parametrize("command", list(COMMANDS))
def test_unknown_flags_and_bad_environment_exit_2(command):
    argv, flag = COMMANDS[command]
    done = run([*argv, "--frobnicate", "1"])
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--frobnicate" in done.stderr
    env = "LOOM_" + flag[2:].upper().replace("-", "_")
    done = run(argv, env={env: "2.5"})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert flag in done.stderr and "2.5" in done.stderr, done.stderr


def worker_command_line(args, env=None):
    done = run(["loom", "up", str(h.MODEL_PATH), "--print-worker-commands", *args], env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines, done.stdout
    return lines[0].split()


def test_up_forwards_worker_flags_with_command_line_over_environment_over_file(tmp_path):
    config = tmp_path / "up.yaml"
    config.write_text("kv-dtype: f32\nblock_size: 8\nmetrics-port: 9100\ncuda-graphs: off\n")
    argv = worker_command_line(["--config", str(config), "--block-size=32"],
                               env={"LOOM_METRICS_PORT": "9200"})
    assert "--block-size=32" in argv          # command line > file
    assert "--metrics-port=9200" in argv      # environment > file
    assert "--kv-dtype=f32" in argv           # file > default
    assert "--cuda-graphs=off" in argv
    # The worker itself reads the same forms.
    done = run(["loom-worker", "--model", str(h.MODEL_PATH), "--coordinator", "127.0.0.1:1",
                "--config", str(config), "--block-size", "0"])
    assert done.returncode == 2 and "--block-size" in done.stderr, done.stderr


def test_up_takes_vllm_and_old_names_alike():
    new = worker_command_line(["-tp", "2", "--data-parallel-size", "1", "--device", "cpu"])
    old = worker_command_line(["--tensor-parallel", "2", "--replicas", "1", "--device=cpu"])
    assert new == old and "--world-size" in new and "--device=cpu" in new


def test_worker_refuses_a_kv_pool_that_cannot_hold_max_model_len():
    done = run(["loom-worker", "--model", str(h.MODEL_PATH), "--coordinator", "127.0.0.1:1",
                "--kv-cache-memory", "1MiB", "--max-model-len", "8192", "--threads", "1"],
               timeout=180)
    assert done.returncode == 1, done.stderr
    assert "--max-model-len 8192 needs" in done.stderr, done.stderr


def test_serve_refuses_max_model_len_beyond_the_model():
    done = run(["loom", "serve", str(h.MODEL_PATH), "--max-model-len", "100000000",
                "--grpc-port", "0", "--port", "-1"], timeout=120)
    assert done.returncode == 1, done.stderr
    assert "longer than the model's context length" in done.stderr, done.stderr
