#!/usr/bin/env bash
# Installs everything Loom needs to build and test on a fresh Debian machine.
# Idempotent: packages already present are skipped, the virtualenv is reused.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

apt_packages=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgloo-dev libpcre2-dev nlohmann-json3-dev libcpp-httplib-dev
  # The HTTP front end (Boost.Beast and Boost.Asio, header-only); cpp-httplib stays for
  # the HTTP clients (cli/hf_hub, the OpenAI load generator).
  libboost-dev
  # API keys' digests and HTTPS (cpp-httplib's OpenSSL build); the openssl CLI makes the
  # self-signed certificate of tests/http/api_keys_test.py.
  libssl-dev openssl
  libutf8proc-dev
  # cli/: the command-line parser (CLI11, header-only) and --config's YAML reader.
  libcli11-dev libyaml-cpp-dev
  prometheus
  clang libclang-rt-14-dev
  python3 python3-venv
  # tests/deploy: the Helm chart is rendered with Helm's engine (Go text/template + sprig,
  # values.schema.json checked with gojsonschema).
  golang-go golang-github-masterminds-sprig-dev golang-github-xeipuuv-gojsonschema-dev
  golang-gopkg-yaml.v2-dev golang-gopkg-yaml.v3-dev
)

# Text corpus for `loom quantize --method awq` calibration and `loom perplexity` (tests and
# bench/quantization_bench.py): the Python documentation's reST sources, plain text under
# /usr/share/doc/python3.11/html/_sources (library/ calibrates, tutorial/ is held out).
apt_packages+=(python3-doc)

missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ ! -d /usr/share/doc/python3.11/html/_sources/tutorial ]; then
  echo "install-deps: warning: python3-doc is installed but its text is not (a dpkg path-exclude" \
    "for /usr/share/doc?); the quantization tests and bench need it" >&2
fi

# Python: tests, references and the client SDK only (never the serving path).
venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$root/scripts/requirements-test.txt" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -r "$root/scripts/requirements-test.txt"
  echo "$want" >"$stamp"
fi
# The Python client SDK (client/python), its stubs generated from proto/ when it is built:
# reinstalled whenever its sources or the .proto files change. No build isolation: the
# venv's grpcio-tools generates code for the venv's own protobuf runtime.
client_stamp="$venv/.loom-client.sha256"
client_want="$(cd "$root" && find client/python proto -type f \( -name '*.py' -o -name '*.toml' -o -name '*.proto' \) \
  -not -path '*/build/*' -not -path '*/_proto/*' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$client_stamp" 2>/dev/null)" != "$client_want" ]; then
  "$venv/bin/pip" install -q --no-build-isolation "$root/client/python"
  echo "$client_want" >"$client_stamp"
fi
echo "install-deps: ok"
