// Test support: runs the real decisiond binary as a child process on loopback with a free
// port (port 0) and a temporary data directory, and talks to it with the generated client.
#ifndef DECISION_TESTS_DECISIOND_PROCESS_H_
#define DECISION_TESTS_DECISIOND_PROCESS_H_

#include <sched.h>
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "decision/v1/decision.grpc.pb.h"

namespace decision::testing {

// A fresh empty directory under $TEST_TMPDIR or /tmp, removed with its contents when the
// test program exits normally (DECISION_KEEP_TEST_DIRS=1 keeps it).
std::string MakeTempDir();

// Parses a CPU list in Linux's format ("0", "0,2", "1-3", as taskset takes it and
// /proc/PID/status prints it); false if it is not one.
bool ParseCpus(absl::string_view text, cpu_set_t* set);

// A child process started with its stdout on a pipe, returned once it printed its first
// line (servers print their address there).
class ChildProcess {
 public:
  // Runs argv (argv[0] is the path) and waits up to 30 s for the first stdout line.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(
      const std::vector<std::string>& argv, std::string* first_line);
  ~ChildProcess();  // SIGKILL if still running
  pid_t pid() const { return pid_; }
  // SIGTERM, then waits; returns the exit status (or -signal if killed by a signal).
  int Terminate();
  // SIGKILL, then waits.
  void Kill();

 private:
  ChildProcess() = default;
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
};

class DecisiondProcess {
 public:
  // Starts decisiond with --data_dir=data_dir, loopback ports chosen by the OS, and the
  // extra flags; returns once it printed its listening line (or fails after 30 s).
  static absl::StatusOr<std::unique_ptr<DecisiondProcess>> Start(
      const std::string& data_dir, const std::vector<std::string>& extra_flags = {});
  ~DecisiondProcess();  // SIGKILL if still running

  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  pid_t pid() const { return child_->pid(); }
  std::unique_ptr<v1::DecisionService::Stub> NewStub() const;

  // SIGTERM, then waits; returns the exit status (or -signal if killed by a signal).
  int Terminate() { return child_->Terminate(); }
  // SIGKILL, then waits.
  void Kill() { child_->Kill(); }

 private:
  DecisiondProcess() = default;
  std::unique_ptr<ChildProcess> child_;
  std::string address_;
  std::string metrics_address_;
};

// One unary RPC with a deadline (tests put one on every call).
template <typename Req, typename Resp>
grpc::Status Call(grpc::Status (v1::DecisionService::Stub::*method)(grpc::ClientContext*,
                                                                    const Req&, Resp*),
                  v1::DecisionService::Stub* stub, const Req& request, Resp* response,
                  std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  return (stub->*method)(&ctx, request, response);
}

#define DECISION_GRPC_CHECK_(check, expr)                                          \
  do {                                                                             \
    const ::grpc::Status grpc_status_ = (expr);                                    \
    check(grpc_status_.ok()) << #expr << ": code " << grpc_status_.error_code()    \
                             << ": " << grpc_status_.error_message();              \
  } while (0)
#define ASSERT_GRPC_OK(expr) DECISION_GRPC_CHECK_(ASSERT_TRUE, expr)
#define EXPECT_GRPC_OK(expr) DECISION_GRPC_CHECK_(EXPECT_TRUE, expr)

// grpc.health.v1.Health/Check of `service` ("" for the server) over a plaintext channel;
// *status is the answer's status (0 UNKNOWN, 1 SERVING, 2 NOT_SERVING, -1 undecodable).
grpc::Status HealthCheck(const std::string& address, const std::string& service, int* status);

// GET http://address/path over a plain socket (IPv4 HOST:PORT); returns the body of a 200
// answer. A send or receive that waits longer than `timeout` fails the request.
absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path,
                                    std::chrono::milliseconds timeout =
                                        std::chrono::seconds(30));

}  // namespace decision::testing

#endif  // DECISION_TESTS_DECISIOND_PROCESS_H_
