// TCP transport: the bootstrap rendezvous and the inter-host data plane.
// Sockets are non-blocking; every wait is bounded by a timeout.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace shoal {
namespace net {

// A listening socket on `address` ("" = any) and `port` (0 = ephemeral).
int listen_on(const std::string& address, int port, int backlog);
int bound_port(int fd);
// The local address of a connected socket (the one that reaches the peer).
std::string local_address(int fd);
// IPv4 address of a network interface, or "" when it has none.
std::string interface_address(const std::string& name);
std::string resolve(const std::string& host);
// Connects, retrying while the peer is not listening yet, until timeout_ms.
int connect_to(const std::string& address, int port, int timeout_ms);
// Accepts one connection within timeout_ms (-1 on timeout).
int accept_one(int listen_fd, int timeout_ms);
void close_fd(int fd);

// One direction of one transfer on a socket.
struct Transfer {
  int fd;
  char* data;
  std::size_t size;
  bool send;
  int peer;  // global rank, for error messages
  std::size_t done = 0;
};

// Drives all transfers to completion together (so large exchanges never
// deadlock on full socket buffers). Throws shoal::Error: PeerLost on EOF or a
// reset, Timeout when no progress was made for timeout_ms. `check` runs
// between polls (abort propagation).
void run(std::vector<Transfer>& transfers, int timeout_ms, const std::string& op,
         const std::function<void()>& check);

// Blocking helpers over run(), for the bootstrap.
void send_all(int fd, const void* data, std::size_t size, int peer, int timeout_ms,
              const std::string& op);
void recv_all(int fd, void* data, std::size_t size, int peer, int timeout_ms,
              const std::string& op);

}  // namespace net
}  // namespace shoal
