#include "tests/decisiond_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>
#include <mutex>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace decision::testing {

namespace {

// The directories MakeTempDir made, removed when the test program that made them exits
// (not by a forked child that exits). DECISION_KEEP_TEST_DIRS=1 keeps them, to look at
// after a failure.
class TempDirs {
 public:
  ~TempDirs() {
    if (getpid() != owner_ || std::getenv("DECISION_KEEP_TEST_DIRS") != nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& dir : dirs_) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }
  void Add(const std::string& dir) {
    std::lock_guard<std::mutex> lock(mu_);
    dirs_.push_back(dir);
  }

 private:
  const pid_t owner_ = getpid();
  std::mutex mu_;
  std::vector<std::string> dirs_;
};

TempDirs& MadeDirs() {
  static TempDirs dirs;
  return dirs;
}

}  // namespace

std::string MakeTempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string root = base != nullptr ? base : "/tmp";
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string dir = absl::StrCat(root, "/decisiond-test-", getpid(), "-", rd());
    if (std::filesystem::create_directories(dir)) {
      MadeDirs().Add(dir);
      return dir;
    }
  }
  return root + "/decisiond-test-fallback";
}

bool ParseCpus(absl::string_view text, cpu_set_t* set) {
  CPU_ZERO(set);
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    const std::vector<absl::string_view> range = absl::StrSplit(item, '-');
    int from, to;
    if (range.size() > 2 || !absl::SimpleAtoi(range[0], &from) ||
        !absl::SimpleAtoi(range.back(), &to) || from < 0 || to < from || to >= CPU_SETSIZE) {
      return false;
    }
    for (int c = from; c <= to; ++c) CPU_SET(c, set);
  }
  return true;
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv_in, std::string* first_line) {
  // The child inherits stdin, stdout (this pipe) and stderr only: no other descriptor of
  // the test (files, earlier children's pipes) leaks into the server, whose open files the
  // soak counts. Everything the child runs between fork and exec is async-signal-safe.
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  std::vector<std::string> args = argv_in;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // A test process that dies (a crash, a failed ASSERT in a forked helper, ctest's timeout)
  // takes its servers with it, instead of leaving them running and ctest waiting for their
  // output pipe until its timeout. The signal follows the thread that forks, not the
  // process: only a fork from the main thread asks for it.
  const pid_t parent = getpid();
  const bool from_main_thread = gettid() == parent;
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    if (from_main_thread) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the parent died before the prctl
    }
    dup2(pipe_fds[1], STDOUT_FILENO);  // the duplicate does not close on exec
    closefrom(STDERR_FILENO + 1);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  std::unique_ptr<ChildProcess> p(new ChildProcess());
  p->pid_ = pid;
  p->stdout_fd_ = pipe_fds[0];
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (line.find('\n') == std::string::npos) {
    const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          deadline - std::chrono::steady_clock::now())
                                          .count());
    if (left <= 0) return absl::DeadlineExceededError(args[0] + " did not start in 30 s");
    pollfd pfd{p->stdout_fd_, POLLIN, 0};
    if (poll(&pfd, 1, left) <= 0) continue;
    char buf[256];
    const ssize_t n = read(p->stdout_fd_, buf, sizeof(buf));
    if (n <= 0) return absl::InternalError(args[0] + " exited before printing its first line");
    line.append(buf, n);
  }
  *first_line = line.substr(0, line.find('\n'));
  return p;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) Kill();
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

int ChildProcess::Terminate() {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return -WTERMSIG(status);
}

void ChildProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

absl::StatusOr<std::unique_ptr<DecisiondProcess>> DecisiondProcess::Start(
    const std::string& data_dir, const std::vector<std::string>& extra_flags) {
  std::vector<std::string> args = {DECISIOND_PATH, "--listen=127.0.0.1:0",
                                   "--metrics_listen=127.0.0.1:0",
                                   absl::StrCat("--data_dir=", data_dir)};
  args.insert(args.end(), extra_flags.begin(), extra_flags.end());
  std::string line;
  std::unique_ptr<DecisiondProcess> p(new DecisiondProcess());
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(args, &line);
  if (!child.ok()) return child.status();
  p->child_ = *std::move(child);
  // "decisiond listening on HOST:PORT metrics on HOST:PORT"
  const std::vector<std::string> words = absl::StrSplit(line, ' ');
  if (words.size() != 7 || words[1] != "listening") {
    return absl::InternalError(absl::StrCat("unexpected start line: ", line));
  }
  p->address_ = words[3];
  p->metrics_address_ = words[6];
  return p;
}

DecisiondProcess::~DecisiondProcess() = default;

std::unique_ptr<v1::DecisionService::Stub> DecisiondProcess::NewStub() const {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  return v1::DecisionService::NewStub(
      grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args));
}

absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path,
                                    std::chrono::milliseconds timeout) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError("bad address " + address);
  }
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::UnavailableError("no socket for " + address);
  timeval limit{};
  limit.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  limit.tv_usec = static_cast<suseconds_t>(timeout.count() % 1000 * 1000);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError("cannot connect to " + address);
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", address, "\r\n\r\n");
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("write failed");
  }
  std::string response;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || body == std::string::npos) {
    return absl::InternalError("not an HTTP response");
  }
  if (response.find(" 200 ") > body) return absl::InternalError("HTTP status is not 200");
  return response.substr(body + 4);
}

// The gRPC health protocol by hand (Debian ships no generated health stubs):
// HealthCheckRequest { string service = 1; } and HealthCheckResponse { enum status = 1; }.
std::string EncodeHealthCheckRequest(const std::string& service) {
  std::string out;
  if (service.empty()) return out;
  out.push_back(0x0a);  // field 1, length-delimited
  out.push_back(static_cast<char>(service.size()));  // REQUIRES: < 128 bytes
  out += service;
  return out;
}

// The status field of a HealthCheckResponse (0 UNKNOWN, 1 SERVING, 2 NOT_SERVING), or -1.
int DecodeHealthCheckStatus(const std::string& bytes) {
  if (bytes.empty()) return 0;  // proto3: the default value is not sent
  if (bytes.size() == 2 && bytes[0] == 0x08) return static_cast<unsigned char>(bytes[1]);
  return -1;
}

grpc::Status HealthCheck(const std::string& address, const std::string& service, int* status) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  const std::string request_bytes = EncodeHealthCheckRequest(service);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status result = done.get_future().get();
  if (result.ok()) {
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (response.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    *status = DecodeHealthCheckStatus(bytes);
  }
  return result;
}

}  // namespace decision::testing
