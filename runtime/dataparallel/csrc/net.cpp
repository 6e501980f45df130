// TCP transport (see net.h).
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <thread>

#include "shoal/core.h"

namespace shoal {
namespace net {
namespace {

[[noreturn]] void sys_fail(const std::string& what) {
  throw Error(Error::Kind::System, what + ": " + std::strerror(errno));
}

void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int buf = 4 << 20;  // large buffers: fewer wake-ups on big shards
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

sockaddr_in make_addr(const std::string& address, int port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  if (address.empty()) {
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
  } else if (inet_pton(AF_INET, resolve(address).c_str(), &sa.sin_addr) != 1) {
    throw Error(Error::Kind::Usage, "not an IPv4 address: " + address);
  }
  return sa;
}

}  // namespace

std::string resolve(const std::string& host) {
  in_addr probe{};
  if (inet_pton(AF_INET, host.c_str(), &probe) == 1) return host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr)
    throw Error(Error::Kind::Usage, "cannot resolve host '" + host + "'");
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof buf);
  freeaddrinfo(res);
  return buf;
}

int listen_on(const std::string& address, int port, int backlog) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) sys_fail("socket");
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa = make_addr(address, port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    sys_fail("bind " + (address.empty() ? std::string("*") : address) + ":" +
             std::to_string(port));
  }
  if (listen(fd, backlog) != 0) sys_fail("listen");
  return fd;
}

int bound_port(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  return ntohs(sa.sin_port);
}

std::string local_address(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
  return buf;
}

std::string interface_address(const std::string& name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if (name != it->ifa_name) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, buf, sizeof buf);
    found = buf;
    break;
  }
  freeifaddrs(list);
  return found;
}

int connect_to(const std::string& address, int port, int timeout_ms) {
  const sockaddr_in sa = make_addr(address, port);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) sys_fail("socket");
    if (connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0) {
      tune(fd);
      return fd;
    }
    int e = errno;
    close(fd);
    if (std::chrono::steady_clock::now() >= deadline) {
      errno = e;
      throw Error(Error::Kind::Timeout, "could not connect to " + address + ":" +
                                            std::to_string(port) + " within " +
                                            std::to_string(timeout_ms / 1000) + "s: " +
                                            std::strerror(e));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int accept_one(int listen_fd, int timeout_ms) {
  pollfd p{listen_fd, POLLIN, 0};
  int r = poll(&p, 1, timeout_ms);
  if (r <= 0) return -1;
  int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) sys_fail("accept");
  tune(fd);
  return fd;
}

void close_fd(int fd) {
  if (fd >= 0) close(fd);
}

static bool step(Transfer& t, const std::string& op) {
  while (t.done < t.size) {
    ssize_t n = t.send ? ::send(t.fd, t.data + t.done, t.size - t.done, MSG_NOSIGNAL)
                       : ::recv(t.fd, t.data + t.done, t.size - t.done, 0);
    if (n > 0) {
      t.done += (std::size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    std::string why = n == 0 ? "closed the connection" : std::strerror(errno);
    throw Error(Error::Kind::PeerLost,
                op + ": connection to rank " + std::to_string(t.peer) + " lost (" + why + ")",
                {t.peer});
  }
  return true;
}

std::string timed_out(const std::string& op, int timeout_ms, const std::string& waiting,
                      const std::string& note) {
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", timeout_ms / 1000.0);
  return op + " timed out after " + secs + "s " + waiting + " (" + note + ")";
}

void run(std::vector<Transfer>& transfers, int timeout_ms, const std::string& op,
         const std::function<void()>& check, const std::string& note) {
  auto last_progress = std::chrono::steady_clock::now();
  std::vector<pollfd> fds;
  std::vector<Transfer*> live;
  for (;;) {
    fds.clear();
    live.clear();
    bool progressed = false;
    for (Transfer& t : transfers) {
      if (t.done >= t.size) continue;
      std::size_t before = t.done;
      if (step(t, op)) {
        progressed = true;
        continue;
      }
      progressed |= t.done != before;
      fds.push_back({t.fd, (short)(t.send ? POLLOUT : POLLIN), 0});
      live.push_back(&t);
    }
    if (live.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    if (progressed) last_progress = now;
    if (now - last_progress > std::chrono::milliseconds(timeout_ms)) {
      std::vector<int> peers;
      std::string names;
      for (Transfer* t : live) {
        peers.push_back(t->peer);
        names += (names.empty() ? "" : ", ") + std::to_string(t->peer);
      }
      throw Error(Error::Kind::Timeout,
                  timed_out(op, timeout_ms, "waiting for ranks [" + names + "]", note), peers);
    }
    if (poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) sys_fail("poll");
    if (check) check();
  }
}

void send_all(int fd, const void* data, std::size_t size, int peer, int timeout_ms,
              const std::string& op) {
  std::vector<Transfer> t{{fd, static_cast<char*>(const_cast<void*>(data)), size, true, peer}};
  run(t, timeout_ms, op, nullptr);
}

void recv_all(int fd, void* data, std::size_t size, int peer, int timeout_ms,
              const std::string& op) {
  std::vector<Transfer> t{{fd, static_cast<char*>(data), size, false, peer}};
  run(t, timeout_ms, op, nullptr);
}

namespace {

// The frame of a notice on a control connection: this header, then `nranks`
// int32 ranks, then `length` bytes of message.
struct Frame {
  uint32_t magic;
  int32_t type;
  int32_t kind;
  int32_t origin;
  uint32_t nranks;
  uint32_t length;
};
constexpr uint32_t kFrameMagic = 0x53484E54u;  // "SHNT"
constexpr int32_t kFailure = 1, kGoodbye = 2;
constexpr uint32_t kMaxRanks = 4096, kMaxMessage = 4096;

void send_frame(int fd, const std::string& frame) {
  if (fd < 0) return;
  // Only notices use this socket, so its buffer is empty and the first send
  // normally takes the whole frame; the deadline bounds the odd partial one.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  std::size_t done = 0;
  while (done < frame.size()) {
    ssize_t n = ::send(fd, frame.data() + done, frame.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += (std::size_t)n;
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    pollfd p{fd, POLLOUT, 0};
    poll(&p, 1, (int)left.count());
  }
}

std::string frame_of(int32_t type, const Failure* f) {
  Frame h{kFrameMagic, type, 0, -1, 0, 0};
  std::string message;
  std::vector<int32_t> ranks;
  if (f != nullptr) {
    h.kind = static_cast<int32_t>(f->kind);
    h.origin = f->origin;
    ranks.assign(f->ranks.begin(), f->ranks.begin() + std::min<std::size_t>(f->ranks.size(), kMaxRanks));
    message = f->message.substr(0, kMaxMessage);
    h.nranks = (uint32_t)ranks.size();
    h.length = (uint32_t)message.size();
  }
  std::string out(reinterpret_cast<const char*>(&h), sizeof h);
  out.append(reinterpret_cast<const char*>(ranks.data()), ranks.size() * sizeof(int32_t));
  return out + message;
}

}  // namespace

void send_failure(int fd, const Failure& failure) { send_frame(fd, frame_of(kFailure, &failure)); }

void send_goodbye(int fd) { send_frame(fd, frame_of(kGoodbye, nullptr)); }

void Control::receive(int wait_ms) {
  if (fd_ < 0) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  for (;;) {
    char buf[4096];
    while (!closed_) {
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n > 0) {
        pending_.append(buf, (std::size_t)n);
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        break;
      } else {
        closed_ = true;  // EOF, or a reset: nothing more will come
        closed_at_ = std::chrono::steady_clock::now();
      }
    }
    parse();
    if (settled()) return;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    pollfd p{fd_, POLLIN, 0};
    poll(&p, 1, (int)left.count());
  }
}

void Control::parse() {
  while (pending_.size() >= sizeof(Frame)) {
    Frame h;
    std::memcpy(&h, pending_.data(), sizeof h);
    if (h.magic != kFrameMagic || (h.type != kFailure && h.type != kGoodbye) ||
        h.nranks > kMaxRanks || h.length > kMaxMessage) {
      // Not a notice: nothing on this connection can be trusted any more.
      pending_.clear();
      closed_ = true;
      return;
    }
    const std::size_t total = sizeof h + h.nranks * sizeof(int32_t) + h.length;
    if (pending_.size() < total) return;
    if (h.type == kGoodbye) {
      goodbye_ = true;
    } else if (!failure_) {
      Failure f;
      const bool known = h.kind >= 0 && h.kind <= static_cast<int32_t>(Error::Kind::System);
      f.kind = known ? static_cast<Error::Kind>(h.kind) : Error::Kind::System;
      f.origin = h.origin;
      f.ranks.resize(h.nranks);
      std::memcpy(f.ranks.data(), pending_.data() + sizeof h, h.nranks * sizeof(int32_t));
      f.message = pending_.substr(sizeof h + h.nranks * sizeof(int32_t), h.length);
      failure_ = std::move(f);
    }
    pending_.erase(0, total);
  }
}

}  // namespace net
}  // namespace shoal
