// The parts of a listen address ("host:port", an IPv6 host in brackets: "[::1]:8080"), as
// decisiond's flags give them.
#ifndef DECISION_SERVER_LISTEN_ADDRESS_H_
#define DECISION_SERVER_LISTEN_ADDRESS_H_

#include <string>

namespace decision::server {

// Everything before the last ':', as written ("[::1]" keeps its brackets).
inline std::string ListenHostPart(const std::string& listen) {
  return listen.substr(0, listen.rfind(':'));
}

// The host itself: ListenHostPart without an IPv6 address's brackets ("::1").
inline std::string ListenHost(const std::string& listen) {
  std::string host = ListenHostPart(listen);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

}  // namespace decision::server

#endif  // DECISION_SERVER_LISTEN_ADDRESS_H_
