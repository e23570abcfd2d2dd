// Small helpers shared by the in-process benchmarks: wall time, CPU time and resident
// memory.
#ifndef DECISION_BENCH_PROCESS_STATS_H_
#define DECISION_BENCH_PROCESS_STATS_H_

#include <sys/resource.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>

namespace decision::bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// CPU time of this process so far, every thread, user and system, in seconds.
inline double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
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
