// The Prometheus metrics endpoint of decisiond: prometheus-cpp's Exposer, which serves over
// HTTP with civetweb, made to stop at once.
//
// civetweb's master thread waits for connections in poll() calls of 2 s (its
// SOCKET_TIMEOUT_QUANTUM) and sees mg_stop's flag only when one returns, so destroying an
// Exposer took up to 2 s, after decisiond had said "stopped cleanly", at every exit. The
// destructor ends that wait: while the Exposer stops, a thread connects to its port every
// 10 ms (an empty connection, closed at once). The addresses it connects to are resolved
// at Start, so that stopping never waits for a name lookup.
#ifndef DECISION_SERVER_METRICS_ENDPOINT_H_
#define DECISION_SERVER_METRICS_ENDPOINT_H_

#include <sys/socket.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace decision::server {

class MetricsEndpoint {
 public:
  // Serves `registry` on `listen` (host:port; port 0 picks one). INVALID_ARGUMENT, saying
  // why, when it cannot (a bad address, a port in use).
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& listen, std::shared_ptr<prometheus::Registry> registry);
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;
  ~MetricsEndpoint();

  // The host of `listen` and the port bound.
  const std::string& address() const { return address_; }

 private:
  MetricsEndpoint() = default;
  // Connects to the endpoint and closes the connection; errors are ignored (once stopped,
  // nothing listens).
  void WakeOnce() const;

  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;
  std::vector<std::pair<sockaddr_storage, socklen_t>> wake_addresses_;
};

}  // namespace decision::server

#endif  // DECISION_SERVER_METRICS_ENDPOINT_H_
