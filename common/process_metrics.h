#pragma once

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace loom::common {

/// The standard `process_*` metrics of this process (the names and meanings of the
/// Prometheus client libraries' process collectors, which prometheus-cpp lacks), read
/// from /proc/self at each collection: process_cpu_seconds_total,
/// process_resident_memory_bytes, process_virtual_memory_bytes, process_open_fds,
/// process_max_fds, process_start_time_seconds. Series that cannot be read (no /proc)
/// are left out. Thread-safe (stateless).
class ProcessCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace loom::common
