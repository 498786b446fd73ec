#include "common/process_metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "prometheus/metric_type.h"

namespace loom::common {
namespace {

std::map<std::string, double> Collected() {
  std::map<std::string, double> values;
  for (const prometheus::MetricFamily& family : ProcessCollector().Collect()) {
    EXPECT_EQ(family.metric.size(), 1u) << family.name;
    const prometheus::ClientMetric& metric = family.metric.front();
    values[family.name] = family.type == prometheus::MetricType::Counter ? metric.counter.value
                                                                         : metric.gauge.value;
  }
  return values;
}

TEST(ProcessCollectorTest, ReportsTheStandardProcessMetricsOfThisProcess) {
  const std::map<std::string, double> values = Collected();
  for (const char* name :
       {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
        "process_open_fds", "process_start_time_seconds"}) {
    ASSERT_TRUE(values.contains(name)) << name;
  }
  EXPECT_GE(values.at("process_cpu_seconds_total"), 0);
  EXPECT_GT(values.at("process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(values.at("process_virtual_memory_bytes"), values.at("process_resident_memory_bytes"));
  // stdin, stdout and stderr at least.
  EXPECT_GE(values.at("process_open_fds"), 3);
  // This process started in the past, and not before the last day.
  const double now = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  EXPECT_LE(values.at("process_start_time_seconds"), now + 1);
  EXPECT_GT(values.at("process_start_time_seconds"), now - 86400);
}

TEST(ProcessCollectorTest, OpenFdsFollowsFilesOpenedAndClosed) {
  const double before = Collected().at("process_open_fds");
  const int fd = open("/proc/self/stat", O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(Collected().at("process_open_fds"), before + 1);
  close(fd);
  EXPECT_EQ(Collected().at("process_open_fds"), before);
}

}  // namespace
}  // namespace loom::common
