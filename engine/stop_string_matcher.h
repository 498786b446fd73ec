#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace loom::engine {

/// Finds stop strings in streamed text. Text that could still be the start of a stop
/// string is held back until it is known not to be one, so a client never sees part of
/// a stop string. The stop string itself is not in `text` (Emitted names it). One per sequence; not
/// thread-safe.
class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stop_strings);

  struct Emitted {
    std::string text;      // safe to send now
    bool stopped = false;  // a stop string ended the text (text holds what precedes it)
    std::string stop_string;  // when stopped: the stop string that matched
  };

  /// Appends newly decoded text; returns what can be sent.
  Emitted Append(std::string_view text);
  /// Everything held back (the sequence ended for another reason).
  std::string Flush();

 private:
  std::vector<std::string> stop_strings_;
  size_t longest_ = 0;   // length of the longest stop string
  std::string pending_;  // held back: a suffix that is a prefix of some stop string
  bool stopped_ = false;
};

}  // namespace loom::engine
