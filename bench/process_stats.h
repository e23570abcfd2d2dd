// Small helpers shared by the in-process benchmarks: wall time and resident memory.
#ifndef DECISION_BENCH_PROCESS_STATS_H_
#define DECISION_BENCH_PROCESS_STATS_H_

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>

namespace decision::bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// VmRSS of this process in bytes, -1 if /proc/self/status has none.
inline int64_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

}  // namespace decision::bench

#endif  // DECISION_BENCH_PROCESS_STATS_H_
