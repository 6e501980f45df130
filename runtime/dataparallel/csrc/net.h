// TCP transport: the bootstrap rendezvous, the inter-host data plane, and
// the control connections that carry failure notices between hosts.
// Sockets are non-blocking; every wait is bounded by a timeout.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "failure.h"

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

// "<op> timed out after <t>s <waiting> (<note>)": every time-out error's text.
// `note` says where the time-out comes from (the environment, or the group's
// own, as set by the framework) and names the group when it has a name.
std::string timed_out(const std::string& op, int timeout_ms, const std::string& waiting,
                      const std::string& note);

// Drives all transfers to completion together (so large exchanges never
// deadlock on full socket buffers). Throws shoal::Error: PeerLost on EOF or a
// reset, Timeout when no progress was made for timeout_ms. `check` runs
// between polls (abort propagation).
void run(std::vector<Transfer>& transfers, int timeout_ms, const std::string& op,
         const std::function<void()>& check,
         const std::string& note = "SHOAL_COLLECTIVE_TIMEOUT");

// Blocking helpers over run(), for the bootstrap.
void send_all(int fd, const void* data, std::size_t size, int peer, int timeout_ms,
              const std::string& op);
void recv_all(int fd, void* data, std::size_t size, int peer, int timeout_ms,
              const std::string& op);

// Control connections: one per inter-host peer pair, next to the data
// connection. The data connection carries raw bytes without framing, so
// notices need a connection of their own: a framed failure when a rank fails,
// a goodbye when it shuts down cleanly. A control connection that closes
// without either means that the peer process died.
//
// Both sends are best effort and never block for long: a peer that is gone
// is not an error here.
void send_failure(int fd, const Failure& failure);
void send_goodbye(int fd);

// The receiving end of a control connection (does not own the socket).
class Control {
 public:
  Control(int fd, int peer) : fd_(fd), peer_(peer) {}
  int fd() const { return fd_; }
  int peer() const { return peer_; }
  // Reads what has arrived; waits up to wait_ms for a notice or the close.
  void receive(int wait_ms);
  // The peer's failure notice, once it arrived.
  const std::optional<Failure>& failure() const { return failure_; }
  bool goodbye() const { return goodbye_; }
  // The peer's end is closed (or broken), after everything it sent.
  bool closed() const { return closed_; }
  std::chrono::steady_clock::time_point closed_at() const { return closed_at_; }

 private:
  bool settled() const { return failure_ || goodbye_ || closed_; }
  void parse();

  int fd_;
  int peer_;
  std::string pending_;  // bytes of an incomplete frame
  std::optional<Failure> failure_;
  bool goodbye_ = false;
  bool closed_ = false;
  std::chrono::steady_clock::time_point closed_at_{};
};

}  // namespace net
}  // namespace shoal
