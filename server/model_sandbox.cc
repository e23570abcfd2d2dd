#include "server/model_sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/model_probe_protocol.h"

namespace decision::server {
namespace {

// Closes the file descriptors it owns on every return path.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat("model sandbox: ", what, ": ", std::strerror(errno)));
}

std::string DescribeDeath(int wait_status, bool timed_out, const ModelSandboxOptions& o) {
  if (timed_out) {
    return absl::StrCat("the model did not load and predict the probe rows within ",
                        o.timeout_ms, " ms (the sandbox's time limit)");
  }
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    std::string why;
    switch (sig) {
      case SIGXCPU: why = absl::StrCat(" (its CPU limit of ", o.cpu_seconds, " s)"); break;
      case SIGABRT:
        why = absl::StrCat(" (an abort, often its memory limit of ", o.memory_mb, " MB)");
        break;
      case SIGSEGV: why = " (a segmentation fault)"; break;
      default: break;
    }
    return absl::StrCat("loading or scoring the model killed the sandboxed probe with signal ",
                        sig, " ", strsignal(sig), why);
  }
  return absl::StrCat("the sandboxed probe exited with status ", WEXITSTATUS(wait_status),
                      " without an answer");
}

}  // namespace

absl::StatusOr<std::string> ModelSandbox::Check(const ModelProbeRequest& request) const {
  const std::string input = probe::EncodeRequest(request.num_arms, request.num_features,
                                                 request.model, request.rows);
  // The request goes over a socket pair rather than a pipe: send() with MSG_NOSIGNAL
  // reports a probe that stopped reading as EPIPE without raising SIGPIPE in this process
  // (which the embedding program may not ignore).
  int in_pipe[2], out_pipe[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in_pipe) != 0) {
    return Errno("socketpair");
  }
  Fd in_read(in_pipe[0]), in_write(in_pipe[1]);
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return Errno("pipe");
  Fd out_read(out_pipe[0]), out_write(out_pipe[1]);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_read.get(), 0);
  posix_spawn_file_actions_adddup2(&actions, out_write.get(), 1);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
#endif
  const std::string memory = absl::StrCat("--memory_mb=", options_.memory_mb);
  const std::string cpu = absl::StrCat("--cpu_seconds=", options_.cpu_seconds);
  char* argv[] = {const_cast<char*>(options_.probe_path.c_str()), const_cast<char*>(memory.c_str()),
                  const_cast<char*>(cpu.c_str()), nullptr};
  // No inherited environment: the probe needs none, and OMP_NUM_THREADS keeps libxgboost's
  // OpenMP runtime to one thread.
  char omp[] = "OMP_NUM_THREADS=1";
  char* envp[] = {omp, nullptr};
  pid_t pid = -1;
  const int spawned =
      posix_spawn(&pid, options_.probe_path.c_str(), &actions, nullptr, argv, envp);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    errno = spawned;
    return Errno(absl::StrCat("cannot start ", options_.probe_path));
  }
  in_read.Reset();
  out_write.Reset();
  fcntl(in_write.get(), F_SETFL, O_NONBLOCK);
  fcntl(out_read.get(), F_SETFL, O_NONBLOCK);

  // Feed the request and collect the answer until the probe closes its output or the
  // deadline passes. The answer is bounded: a canonical model is the input or its UBJSON
  // conversion, which is not larger than a few times the legacy bytes.
  const size_t max_output = 8 * request.model.size() + (1 << 20);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  std::string output;
  size_t written = 0;
  bool timed_out = false, oversized = false;
  char buffer[1 << 16];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd fds[2];
    int n = 0;
    fds[n++] = {out_read.get(), POLLIN, 0};
    if (in_write.get() >= 0) fds[n++] = {in_write.get(), POLLOUT, 0};
    const int ready = poll(fds, n, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) break;
    if (n == 2 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
      const ssize_t w = send(in_write.get(), input.data() + written, input.size() - written,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) written += w;
      // EPIPE: the probe stopped reading (it refused the header, or died); its answer or
      // its exit status says why.
      if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) {
        in_write.Reset();
      }
    }
    if (fds[0].revents & (POLLIN | POLLERR | POLLHUP)) {
      const ssize_t r = read(out_read.get(), buffer, sizeof(buffer));
      if (r == 0) break;  // the probe is done
      if (r > 0) {
        output.append(buffer, r);
        if (output.size() > max_output) {
          oversized = true;
          break;
        }
      } else if (errno != EAGAIN && errno != EINTR) {
        break;
      }
    }
  }
  in_write.Reset();
  out_read.Reset();
  if (timed_out || oversized) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (oversized) {
    return absl::InvalidArgumentError(absl::StrCat(
        "xgboost expert: the sandboxed probe answered more than ", max_output, " bytes"));
  }
  if (timed_out || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("xgboost expert: ", DescribeDeath(status, timed_out, options_)));
  }
  return probe::DecodeResponse(output);
}

std::vector<double> ProbeRows(absl::Span<const double> real, int num_features, int max_real) {
  std::vector<double> rows;
  if (num_features <= 0) return rows;
  const size_t real_rows =
      std::min<size_t>(real.size() / num_features, static_cast<size_t>(std::max(0, max_real)));
  rows.assign(real.begin(), real.begin() + real_rows * num_features);
  const auto add_row = [&](auto value) {
    for (int i = 0; i < num_features; ++i) rows.push_back(value(i));
  };
  add_row([](int) { return 0.0; });
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int r = 0; r < 8; ++r) {
    add_row([&](int) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<double>(state >> 11) / static_cast<double>(1ull << 53) * 8.0 - 4.0;
    });
  }
  for (const double big : {1e6, -1e6, 1e30, -1e30}) add_row([&](int) { return big; });
  return rows;
}

}  // namespace decision::server
