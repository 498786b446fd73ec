#!/usr/bin/env bash
# Builds tests/fuzz/<target>_fuzz.cc with clang's libFuzzer + ASan + UBSan and runs it
# for a bounded time on a copy of the seed corpus. Fails on any crash or sanitizer
# report (exit 1: libFuzzer's own default, 77, is ctest's SKIP code, so a crash it found
# used to read as a skip); exits 77 (ctest SKIP) when clang's fuzzer runtime is not installed.
#
#   run_fuzz.sh <clang++> <source dir> <work dir> <seconds> [target: gguf_file | safetensors_file]
set -euo pipefail

clangxx="$1"
source_dir="$2"
work_dir="$3"
seconds="$4"
target="${5:-gguf_file}"

mkdir -p "$work_dir"
cd "$work_dir"

# Does this clang have a libFuzzer runtime (libclang-rt-*-dev)?
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' \
  > probe.cc
if ! "$clangxx" -fsanitize=fuzzer probe.cc -o probe 2> probe.log; then
  echo "SKIP: $clangxx cannot link -fsanitize=fuzzer (install libclang-rt-dev):"
  cat probe.log
  exit 77
fi

absl_libs=(
  -labsl_statusor -labsl_status -labsl_str_format_internal -labsl_strings
  -labsl_strings_internal -labsl_raw_hash_set -labsl_hash -labsl_city
  -labsl_low_level_hash -labsl_cord -labsl_cordz_info -labsl_cord_internal
  -labsl_cordz_functions -labsl_cordz_handle -labsl_synchronization -labsl_time
  -labsl_time_zone -labsl_int128 -labsl_throw_delegate -labsl_raw_logging_internal
  -labsl_base -labsl_spinlock_wait -labsl_malloc_internal -labsl_stacktrace
  -labsl_symbolize -labsl_debugging_internal -labsl_demangle_internal
  -labsl_exponential_biased -labsl_bad_optional_access -labsl_bad_variant_access
)

case "$target" in
  gguf_file)
    sources=(common/formats/gguf_file.cc common/formats/file_image.cc common/formats/ggml_type.cc common/formats/kquant_block.cc common/formats/model_config.cc
             common/formats/model_config_experts.cc common/formats/architecture.cc
             common/sampling_defaults.cc common/rope_frequencies.cc)
    corpus_dir=gguf ;;
  safetensors_file)
    sources=(common/formats/safetensors_file.cc common/formats/file_image.cc)
    corpus_dir=safetensors ;;
  *) echo "unknown fuzz target $target"; exit 2 ;;
esac

echo "Building ${target}_fuzz with $clangxx"
"$clangxx" -std=c++20 -O1 -g -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$source_dir" \
  "$source_dir/tests/fuzz/${target}_fuzz.cc" \
  "${sources[@]/#/$source_dir/}" \
  "${absl_libs[@]}" -o "${target}_fuzz"

rm -rf corpus
mkdir corpus
cp "$source_dir"/tests/fuzz/corpus/"$corpus_dir"/* corpus/

echo "Fuzzing for ${seconds}s"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
"./${target}_fuzz" -max_total_time="$seconds" -max_len=16384 -rss_limit_mb=2048 \
  -timeout=10 -print_final_stats=1 -artifact_prefix="$work_dir/" -error_exitcode=1 \
  -timeout_exitcode=1 corpus
