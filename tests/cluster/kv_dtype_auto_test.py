"""The KV cache's type `auto` (vLLM's: the compute type's; the default of --kv-dtype and
--kv-cache-dtype), resolved by each worker once its device is placed (worker::ResolveKvDtype)
and registered with the coordinator: a CPU worker under f32 activations keeps an F16 pool, one
under --activations bf16 a BF16 pool (what its AMX attention reads as it is), and a type given
on the command line stays. Replicas move KV between each other only when these names agree."""
import os
import pathlib

import pytest

import cluster_harness as h


def bf16_runs() -> bool:
    """--activations bf16 needs Intel AMX-BF16 (the worker refuses it elsewhere)."""
    flags = pathlib.Path("/proc/cpuinfo").read_text().split()
    return ("amx_bf16" in flags and "avx512_bf16" in flags and
            os.environ.get("LOOM_CPU_ISA", "") in ("", "amx"))


def test_auto_kv_type_follows_the_activations_and_a_given_type_stays(tmp_path):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    want = {"f32": "f16", "f32-bf16": "bf16"}
    workers = {"f32": {"activations": "f32"}, "f32-bf16": {"activations": "f32", "kv_dtype": "bf16"}}
    if bf16_runs():
        want.update({"bf16": "bf16", "bf16-f16": "f16", "bf16-auto": "bf16"})
        workers.update({"bf16": {"activations": "bf16"},
                        "bf16-f16": {"activations": "bf16", "kv_dtype": "f16"},
                        "bf16-auto": {"activations": "bf16", "kv_cache_dtype": "auto"}})
    for flags in workers.values():
        flags["kv_cache_memory"] = "32MiB"
    with h.running_cluster(tmp_path, workers, http_port=-1) as rig:
        replicas = rig.coordinator.replicas()
        assert {r: replicas[r].kv_dtype for r in want} == want
