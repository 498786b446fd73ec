#include "common/process_metrics.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "prometheus/client_metric.h"
#include "prometheus/metric_type.h"

namespace loom::common {
namespace {

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type,
                                double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(metric);
  return family;
}

// Fields of /proc/self/stat after the command name: utime (14), stime (15),
// starttime (22), vsize (23), rss (24), counted from 1 over the whole line.
struct Stat {
  double utime_ticks = 0, stime_ticks = 0, start_ticks = 0, vsize_bytes = 0, rss_pages = 0;
};

std::optional<Stat> ReadStat() {
  std::ifstream file("/proc/self/stat");
  std::string line;
  if (!std::getline(file, line)) return std::nullopt;
  // The command name is in parentheses and may hold spaces: parse after the last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(line.substr(close + 2));
  std::string field;
  Stat stat;
  for (int index = 3; fields >> field; ++index) {
    try {
      if (index == 14) stat.utime_ticks = std::stod(field);
      if (index == 15) stat.stime_ticks = std::stod(field);
      if (index == 22) stat.start_ticks = std::stod(field);
      if (index == 23) stat.vsize_bytes = std::stod(field);
      if (index == 24) {
        stat.rss_pages = std::stod(field);
        return stat;
      }
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

std::optional<double> BootTimeSeconds() {
  std::ifstream file("/proc/stat");
  std::string key;
  double value = 0;
  while (file >> key) {
    if (key == "btime" && file >> value) return value;
    file.ignore(1 << 20, '\n');
  }
  return std::nullopt;
}

std::optional<double> OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  double count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // the directory handle itself
}

std::optional<double> MaxFds() {
  std::ifstream file("/proc/self/limits");
  std::string line;
  while (std::getline(file, line)) {
    if (line.rfind("Max open files", 0) != 0) continue;
    std::istringstream fields(line.substr(14));
    std::string soft;
    if (!(fields >> soft)) return std::nullopt;
    if (soft == "unlimited") return std::nullopt;
    try {
      return std::stod(soft);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> families;
  const double ticks_per_second = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page_bytes = static_cast<double>(sysconf(_SC_PAGESIZE));
  if (std::optional<Stat> stat = ReadStat(); stat.has_value() && ticks_per_second > 0) {
    families.push_back(Family("process_cpu_seconds_total",
                              "Total user and system CPU time spent in seconds.",
                              MetricType::Counter,
                              (stat->utime_ticks + stat->stime_ticks) / ticks_per_second));
    families.push_back(Family("process_resident_memory_bytes", "Resident memory size in bytes.",
                              MetricType::Gauge, stat->rss_pages * page_bytes));
    families.push_back(Family("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                              MetricType::Gauge, stat->vsize_bytes));
    if (std::optional<double> boot = BootTimeSeconds(); boot.has_value()) {
      families.push_back(Family("process_start_time_seconds",
                                "Start time of the process since unix epoch in seconds.",
                                MetricType::Gauge, *boot + stat->start_ticks / ticks_per_second));
    }
  }
  if (std::optional<double> open = OpenFds(); open.has_value()) {
    families.push_back(Family("process_open_fds", "Number of open file descriptors.",
                              MetricType::Gauge, *open));
  }
  if (std::optional<double> max = MaxFds(); max.has_value()) {
    families.push_back(Family("process_max_fds", "Maximum number of open file descriptors.",
                              MetricType::Gauge, *max));
  }
  return families;
}

}  // namespace loom::common
