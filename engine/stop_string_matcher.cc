#include "engine/stop_string_matcher.h"

#include <algorithm>

namespace loom::engine {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings) {
  for (std::string& stop : stop_strings) {
    if (stop.empty()) continue;  // an empty stop string would stop before any text
    longest_ = std::max(longest_, stop.size());
    stop_strings_.push_back(std::move(stop));
  }
}

StopStringMatcher::Emitted StopStringMatcher::Append(std::string_view text) {
  Emitted out;
  if (stopped_) return out;
  if (stop_strings_.empty()) {
    out.text = std::string(text);
    return out;
  }
  pending_.append(text);
  // The earliest complete match wins (a shorter stop string ending later loses).
  size_t match = std::string::npos;
  const std::string* matched = nullptr;
  for (const std::string& stop : stop_strings_) {
    const size_t at = pending_.find(stop);
    if (at != std::string::npos && at < match) {
      match = at;
      matched = &stop;
    }
  }
  if (match != std::string::npos) {
    out.text = pending_.substr(0, match);
    out.stop_string = *matched;
    out.stopped = true;
    stopped_ = true;
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of a stop string.
  size_t hold = 0;
  const size_t max_hold = std::min(pending_.size(), longest_ - 1);
  for (size_t len = max_hold; len > 0 && hold == 0; --len) {
    const std::string_view suffix = std::string_view(pending_).substr(pending_.size() - len);
    for (const std::string& stop : stop_strings_) {
      if (stop.size() > len && std::string_view(stop).substr(0, len) == suffix) {
        hold = len;
        break;
      }
    }
  }
  out.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringMatcher::Flush() {
  std::string rest = std::move(pending_);
  pending_.clear();
  return stopped_ ? std::string() : rest;
}

}  // namespace loom::engine
