// The client library across a server restart: how long after decisiond listens again do
// its callers' Chooses fail? A client calls Choose every --every_ms; decisiond is stopped
// (SIGTERM) and started again on the same port --down_ms later, --restarts times. Prints,
// per restart, when the server listened again and when the last call failed, relative to
// that, and the calls that failed (bench/README.md, "The client across a server restart").
//
//   build/bench/client_restart                             # the client's defaults
//   build/bench/client_restart --reconnect_backoff_ms=0    # gRPC's own reconnect backoff
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "client/decision_client.h"
#include "tests/decisiond_process.h"

ABSL_FLAG(int, restarts, 3, "restarts of decisiond");
ABSL_FLAG(int, down_ms, 1000, "how long decisiond is down at each restart");
ABSL_FLAG(int, every_ms, 50, "the client's pause between two Chooses");
ABSL_FLAG(int, reconnect_backoff_ms, 100,
          "ClientOptions::reconnect_backoff_ms (0: gRPC's own backoff, 1 s and up)");
ABSL_FLAG(int, max_reconnect_backoff_ms, 1000, "ClientOptions::max_reconnect_backoff_ms");

namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0, Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(t - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("client_restart [--restarts=3] [--down_ms=1000] ...");
  absl::ParseCommandLine(argc, argv);
  const std::string data_dir = decision::testing::MakeTempDir();
  auto server = decision::testing::DecisiondProcess::Start(data_dir, {"--metrics_listen="});
  if (!server.ok()) {
    std::fprintf(stderr, "client_restart: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const std::string address = (*server)->address();
  decision::client::ClientOptions options;
  options.address = address;
  options.reconnect_backoff_ms = absl::GetFlag(FLAGS_reconnect_backoff_ms);
  options.max_reconnect_backoff_ms = absl::GetFlag(FLAGS_max_reconnect_backoff_ms);
  decision::client::DecisionClient client(options);
  decision::v1::ProblemConfig config;
  config.set_num_arms(3);
  config.set_num_features(2);
  config.set_reward_wait_ms(600'000);
  if (absl::Status s = client.CreateProblem("p", config).status(); !s.ok()) {
    std::fprintf(stderr, "client_restart: %s\n", s.ToString().c_str());
    return 1;
  }
  // Each call's start and end, and whether it failed.
  struct CallRecord {
    Clock::time_point start, end;
    bool ok;
  };
  std::mutex mu;
  std::vector<CallRecord> calls;
  std::atomic<bool> stop{false};
  std::thread caller([&] {
    while (!stop.load()) {
      const Clock::time_point start = Clock::now();
      const bool ok = client.Choose("p", {0.5, 0.2}).ok();
      {
        std::lock_guard<std::mutex> lock(mu);
        calls.push_back({start, Clock::now(), ok});
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(absl::GetFlag(FLAGS_every_ms)));
    }
  });
  std::printf("restart  down (ms)  last failed call ended, after listening (ms)  failed calls\n");
  int status = 0;
  for (int r = 1; r <= absl::GetFlag(FLAGS_restarts) && status == 0; ++r) {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    const Clock::time_point stopping = Clock::now();
    (*server)->Terminate();
    std::this_thread::sleep_for(std::chrono::milliseconds(absl::GetFlag(FLAGS_down_ms)));
    server = decision::testing::DecisiondProcess::Start(
        data_dir, {"--metrics_listen=", absl::StrCat("--listen=", address)});
    if (!server.ok()) {
      std::fprintf(stderr, "client_restart: %s\n", server.status().ToString().c_str());
      status = 1;
      break;
    }
    const Clock::time_point listening = Clock::now();
    // Long enough for gRPC's own backoff too (it grows to 120 s, but from 1 s).
    std::this_thread::sleep_for(std::chrono::seconds(12));
    std::lock_guard<std::mutex> lock(mu);
    int failed = 0;
    Clock::time_point last_failed = listening;
    for (const CallRecord& c : calls) {
      if (c.start < stopping || c.ok) continue;
      ++failed;
      last_failed = std::max(last_failed, c.end);
    }
    std::printf("%7d  %9.0f  %44.0f  %12d\n", r, MsSince(stopping, listening),
                MsSince(listening, last_failed), failed);
    std::fflush(stdout);
    calls.clear();
  }
  stop = true;
  caller.join();
  return status;
}
