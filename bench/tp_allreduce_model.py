"""A model of tensor parallelism's decode overhead on GPUs (no measurement: this machine has none).

Per decode step a Megatron-sharded llama model does 2 all-reduces per layer (after the attention
output and after the MLP down projection) of batch x hidden values, plus one for the embedding
rows and an all-gather of the logits. Loom's CUDA device (model/cuda_device.cc) keeps
activations in F32 between operations, so its all-reduces (ncclAllReduce on the device's stream,
inside the decode step's CUDA graph) carry 4 bytes per value while the weights are bf16/f16; the
logits gather carries F32 too. The all-reduce latency on H100 NVLink is taken from
published NCCL figures (~5 us at 8 KB to ~25 us at 1 MB, log-linear in between, bandwidth-bound
above at ~350 GB/s bus bandwidth); the step's weight reading from HBM bandwidth (3.35 TB/s, at
the 0.8 that good kernels reach). Prints the predicted per-step overhead for 2/4/8 GPUs and
writes bench/results/tp_allreduce_model.json.

    .venv/bin/python bench/tp_allreduce_model.py
"""
import json
import math
import pathlib

from provenance import provenance

MODELS = {
    "llama-3-8b": {"layers": 32, "hidden": 4096, "vocab": 128256, "params": 8.0e9},
    "llama-3-70b": {"layers": 80, "hidden": 8192, "vocab": 128256, "params": 70.6e9},
}
HBM_BYTES_PER_S = 3.35e12 * 0.8
WEIGHT_BYTES = 2      # bf16/f16 weights
ACTIVATION_BYTES = 4  # F32 activations: what CudaDevice::AllReduceSum hands NCCL


def allreduce_seconds(message_bytes: float) -> float:
    """Published H100 NVLink NCCL all-reduce latency: 5 us at 8 KB, 25 us at 1 MB, bandwidth-bound
    beyond (350 GB/s bus bandwidth)."""
    lo, hi = 8 << 10, 1 << 20
    if message_bytes <= lo:
        return 5e-6
    if message_bytes <= hi:
        f = math.log(message_bytes / lo) / math.log(hi / lo)
        return 5e-6 + f * 20e-6
    return 25e-6 + (message_bytes - hi) / 350e9


def main():
    rows = []
    print(f"{'model':12} {'TP':>3} {'batch':>6} {'msg KB':>8} {'allreduces':>10} {'comm ms':>8} "
          f"{'weights ms':>10} {'overhead':>9}")
    for name, m in MODELS.items():
        for tp in (2, 4, 8):
            for batch in (1, 32, 256):
                message = batch * m["hidden"] * ACTIVATION_BYTES
                count = 2 * m["layers"] + 1
                comm = count * allreduce_seconds(message) + allreduce_seconds(batch * m["vocab"] * 4 / tp)
                weights = m["params"] * WEIGHT_BYTES / tp / HBM_BYTES_PER_S
                rows.append({"model": name, "tp": tp, "batch": batch, "message_bytes": message,
                             "collectives_per_step": count + 1, "comm_ms": comm * 1e3,
                             "weight_read_ms": weights * 1e3, "overhead_ratio": comm / weights})
                print(f"{name:12} {tp:3d} {batch:6d} {message / 1024:8.0f} {count + 1:10d} "
                      f"{comm * 1e3:8.3f} {weights * 1e3:10.3f} {comm / weights:8.1%}")
    out = pathlib.Path(__file__).resolve().parent / "results" / "tp_allreduce_model.json"
    out.write_text(json.dumps({"benchmark": "tp_allreduce_model", "kind": "model, not a measurement",
                               "provenance": provenance(),
                               "assumptions": {"hbm_bytes_per_s": HBM_BYTES_PER_S,
                                               "weight_bytes": WEIGHT_BYTES,
                                               "activation_bytes": ACTIVATION_BYTES,
                                               "allreduce_us": "5 at 8 KB .. 25 at 1 MB (NVLink, NCCL)"},
                               "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
