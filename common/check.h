#pragma once

// Internal invariants only: a failed LOOM_CHECK is a bug in Loom and aborts. Anything
// that comes from a request, a file, a config or a peer is validated and answered with
// an absl::Status instead. (Debian's Abseil predates absl/log, hence our own macro.)

#include <cstdio>
#include <cstdlib>

#define LOOM_CHECK(cond)                                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "%s:%d: LOOM_CHECK failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                        \
      std::abort();                                                               \
    }                                                                             \
  } while (0)
