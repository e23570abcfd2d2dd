// wakeup_latency: how long a woken thread waits before it runs on this machine, by what
// else runs on its CPU. The floor under every latency figure of bench/load: a Choose wakes
// several threads in decisiond (and in the client), and when decisiond shares its CPU with
// its background threads (the learner scoring joins, the trainer), each wake-up waits for
// the kernel to pick the woken thread. See bench/README.md, "What a woken thread waits".
//
// A receiver thread on --cpu blocks on a pipe. A hog thread spins on the same CPU at a
// given priority (none, idle = SCHED_IDLE, niceN = SCHED_OTHER at nice N). The waker writes
// the time into the pipe every --interval_us, either from --waker_cpu (remote: a request
// arriving from another CPU) or from the hog itself between its spins (local: a background
// thread completing work that a request thread waits for). The latency is the time from the
// write to the receiver's return from read().
//
//   build/bench/wakeup_latency [--cpu=0] [--waker_cpu=1] [--wakeups=20000]
//       [--interval_us=300] [--hogs=none,idle,nice19,nice10,nice0] [--wakers=remote,local]
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

ABSL_FLAG(int, cpu, 0, "CPU of the woken thread and of the hog");
ABSL_FLAG(int, waker_cpu, 1, "CPU of the remote waker");
ABSL_FLAG(int, wakeups, 20000, "wake-ups per configuration");
ABSL_FLAG(int, interval_us, 300, "time between two wake-ups");
ABSL_FLAG(std::string, hogs, "none,idle,nice19,nice10,nice0",
          "what spins on --cpu: none, idle (SCHED_IDLE) or niceN (SCHED_OTHER at nice N)");
ABSL_FLAG(std::string, wakers, "remote,local",
          "who wakes the thread: remote (a thread on --waker_cpu) or local (the hog)");

namespace {

using Clock = std::chrono::steady_clock;

bool Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

// Gives the calling thread the hog's priority; false if the system refused it.
bool SetHogPriority(const std::string& hog) {
  if (hog == "idle") {
    sched_param param{};
    return sched_setscheduler(0, SCHED_IDLE, &param) == 0;
  }
  int nice = 0;
  if (hog.rfind("nice", 0) != 0 || !absl::SimpleAtoi(hog.substr(4), &nice)) return false;
  return setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice) == 0;
}

void SpinUntil(Clock::time_point until) {
  while (Clock::now() < until) {
  }
}

struct Latencies {
  std::vector<double> us;
  double Quantile(double q) const { return us[static_cast<size_t>(q * (us.size() - 1))]; }
};

// One configuration; returns false (with a message) if it could not be set up.
bool Run(const std::string& hog, const std::string& waker, Latencies* out) {
  const int cpu = absl::GetFlag(FLAGS_cpu);
  const int wakeups = absl::GetFlag(FLAGS_wakeups);
  const auto interval = std::chrono::microseconds(absl::GetFlag(FLAGS_interval_us));
  int fds[2];
  if (pipe(fds) != 0) return false;
  std::atomic<bool> stop{false};
  std::atomic<bool> failed{false};
  auto send = [&](int n) {
    for (int i = 0; i < n; ++i) {
      const Clock::time_point now = Clock::now();
      if (write(fds[1], &now, sizeof now) != sizeof now) break;
      SpinUntil(now + interval);
    }
  };
  std::thread receiver([&] {
    if (!Pin(cpu)) failed = true;
    Clock::time_point sent;
    while (static_cast<int>(out->us.size()) < wakeups &&
           read(fds[0], &sent, sizeof sent) == sizeof sent) {
      out->us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - sent).count());
    }
  });
  std::thread hog_thread([&] {
    if (hog == "none") return;
    if (!Pin(cpu) || !SetHogPriority(hog)) {
      failed = true;
      return;
    }
    if (waker == "local") {
      send(wakeups);
      return;
    }
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  if (waker == "remote") {
    std::thread remote([&] {
      if (!Pin(absl::GetFlag(FLAGS_waker_cpu))) failed = true;
      send(wakeups);
    });
    remote.join();
    stop = true;
  }
  hog_thread.join();
  close(fds[1]);  // a local waker that failed leaves the receiver waiting: end it
  receiver.join();
  close(fds[0]);
  std::sort(out->us.begin(), out->us.end());
  return !failed && !out->us.empty();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::printf("wakeup_latency: woken thread on CPU %d, %d wake-ups every %d us\n",
              absl::GetFlag(FLAGS_cpu), absl::GetFlag(FLAGS_wakeups),
              absl::GetFlag(FLAGS_interval_us));
  std::printf("%-8s %-7s %9s %9s %9s %9s %9s\n", "hog", "waker", "p50 us", "p90 us", "p99 us",
              "p999 us", "max us");
  int status = 0;
  const std::vector<std::string> wakers = absl::StrSplit(absl::GetFlag(FLAGS_wakers), ',');
  const std::vector<std::string> hogs = absl::StrSplit(absl::GetFlag(FLAGS_hogs), ',');
  for (const std::string& waker : wakers) {
    for (const std::string& hog : hogs) {
      if (waker == "local" && hog == "none") continue;  // the hog is the waker
      if (waker != "local" && waker != "remote") {
        std::fprintf(stderr, "wakeup_latency: unknown waker %s\n", waker.c_str());
        return 2;
      }
      Latencies l;
      if (!Run(hog, waker, &l)) {
        std::fprintf(stderr, "wakeup_latency: could not run hog %s with waker %s (priority or "
                     "CPU refused)\n", hog.c_str(), waker.c_str());
        status = 1;
        continue;
      }
      std::printf("%-8s %-7s %9.1f %9.1f %9.1f %9.1f %9.1f\n", hog.c_str(), waker.c_str(),
                  l.Quantile(0.5), l.Quantile(0.9), l.Quantile(0.99), l.Quantile(0.999),
                  l.us.back());
      std::fflush(stdout);
    }
  }
  return status;
}
