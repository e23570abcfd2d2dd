#include "server/metrics_endpoint.h"

#include <netdb.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "server/listen_address.h"

namespace decision::server {

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& listen, std::shared_ptr<prometheus::Registry> registry) {
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  try {
    endpoint->exposer_ = std::make_unique<prometheus::Exposer>(listen);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot serve metrics on ", listen, ": ", e.what()));
  }
  endpoint->exposer_->RegisterCollectable(registry);
  const auto ports = endpoint->exposer_->GetListeningPorts();
  const int port = ports.empty() ? 0 : ports[0];
  endpoint->address_ = absl::StrCat(ListenHostPart(listen), ":", port);
  // A wildcard address is reached on the loopback of its family.
  std::string host = ListenHost(listen);
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::") host = "::1";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) == 0) {
    for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
      sockaddr_storage to{};
      std::memcpy(&to, a->ai_addr, a->ai_addrlen);
      endpoint->wake_addresses_.emplace_back(to, a->ai_addrlen);
    }
    freeaddrinfo(found);
  }
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() {
  if (exposer_ == nullptr) return;
  std::atomic<bool> stopped{false};
  std::thread waker([&] {
    while (!stopped.load()) {
      WakeOnce();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  exposer_.reset();
  stopped.store(true);
  waker.join();
}

void MetricsEndpoint::WakeOnce() const {
  for (const auto& [to, length] : wake_addresses_) {
    const int fd = socket(to.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const bool connected = connect(fd, reinterpret_cast<const sockaddr*>(&to), length) == 0;
    close(fd);
    if (connected) break;
  }
}

}  // namespace decision::server
