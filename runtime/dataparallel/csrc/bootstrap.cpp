// Configuration and rendezvous (see bootstrap.h).
#include "bootstrap.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>

#include "net.h"

namespace shoal {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

std::string env_or(std::initializer_list<const char*> names, const std::string& fallback) {
  for (const char* n : names)
    if (const char* v = env(n)) return v;
  return fallback;
}

long long env_int(const char* name, long long fallback, long long lo, long long hi) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0')
    throw Error(Error::Kind::Usage, std::string("'") + name + "' must be an integer (got '" + v + "')");
  if (x < lo || x > hi)
    throw Error(Error::Kind::Usage, std::string("'") + name + "' must be in [" +
                                        std::to_string(lo) + ", " + std::to_string(hi) +
                                        "] (got " + v + ")");
  return x;
}

int first_int(std::initializer_list<const char*> names, int fallback, int lo, int hi) {
  for (const char* n : names)
    if (env(n)) return (int)env_int(n, fallback, lo, hi);
  return fallback;
}

void copy_field(char* dst, std::size_t cap, const std::string& src, const char* what) {
  if (src.size() >= cap)
    throw Error(Error::Kind::Usage, std::string(what) + " is too long: " + src);
  std::memset(dst, 0, cap);
  std::memcpy(dst, src.data(), src.size());
}

}  // namespace

Config Config::from_env() {
  Config c;
  c.rank = first_int({"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}, 0, 0, 1 << 20);
  c.size = first_int({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}, 1, 1, 1 << 20);
  if (c.rank >= c.size)
    throw Error(Error::Kind::Usage, "rank " + std::to_string(c.rank) + " must be < world size " +
                                        std::to_string(c.size));
  char hostname[256] = {0};
  gethostname(hostname, sizeof hostname - 1);
  c.host = env_or({"SHOAL_HOST"}, hostname);
  c.job_id = env_or({"SHOAL_JOB_ID", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE",
                     "TORCHELASTIC_RUN_ID"},
                    "default");
  c.master_addr = env_or({"MASTER_ADDR"}, "127.0.0.1");
  // Without MASTER_PORT, derive one from the job id so concurrent jobs differ.
  const int derived = 20000 + (int)(std::hash<std::string>{}(c.job_id) % 20000);
  c.master_port = (int)env_int("MASTER_PORT", derived, 1, 65535);
  c.interface = env_or({"SHOAL_NETWORK_INTERFACE"}, "");
  c.timeout_ms = (int)env_int("SHOAL_COLLECTIVE_TIMEOUT", 300, 1, 86400) * 1000;
  c.fusion_bytes = (std::size_t)env_int("SHOAL_FUSION_THRESHOLD_BYTES", 25ll << 20, 0, 1ll << 40);
  c.chunk_bytes = (std::size_t)env_int("SHOAL_SHM_CHUNK_BYTES", 256ll << 10, 4096, 1ll << 30);
  c.chunk_bytes &= ~std::size_t(63);
  c.small_bytes = (std::size_t)env_int("SHOAL_SMALL_BYTES", 64ll << 10, 0, 1ll << 30);
  c.depth = (int)env_int("SHOAL_SHM_DEPTH", 64, 2, 4096);
  c.single_copy_bytes = (std::size_t)env_int("SHOAL_SINGLE_COPY_BYTES", 2ll << 20, 0, 1ll << 50);
  c.batch_chunks = (uint64_t)env_int("SHOAL_INTERHOST_BATCH", 4, 1, 4096);
  c.global_rank = c.rank;
  return c;
}

Config Config::member(int rank, int size, int global_rank) const {
  if (rank < 0 || rank >= size)
    throw Error(Error::Kind::Usage, "group rank " + std::to_string(rank) + " must be in [0, " +
                                        std::to_string(size - 1) + "]");
  Config c = *this;
  c.rank = rank, c.size = size, c.global_rank = global_rank;
  return c;
}

// Connecting a UDP socket sends nothing; it only picks the route (and so the
// local address) the kernel would use to reach MASTER_ADDR.
std::string Config::reachable_address() const {
  if (!interface.empty()) {
    const std::string a = net::interface_address(interface);
    if (a.empty())
      throw Error(Error::Kind::Usage, "SHOAL_NETWORK_INTERFACE '" + interface +
                                          "' has no IPv4 address on host " + host);
    return a;
  }
  const std::string target = net::resolve(master_addr);
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "127.0.0.1";
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(9);
  inet_pton(AF_INET, target.c_str(), &sa.sin_addr);
  std::string out = target;
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    char buf[INET_ADDRSTRLEN] = {0};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf) != nullptr)
      out = buf;
  }
  close(fd);
  return out;
}

std::string contact_of(const std::string& addr, int port) { return addr + ":" + std::to_string(port); }

void parse_contact(const std::string& contact, std::string& addr, int& port) {
  if (!contact.empty() && contact[0] == '!')
    throw Error(Error::Kind::System, "init: group rank 0 could not start: " + contact.substr(1));
  const auto colon = contact.rfind(':');
  char* end = nullptr;
  const long p = colon == std::string::npos ? 0 : std::strtol(contact.c_str() + colon + 1, &end, 10);
  if (colon == std::string::npos || colon == 0 || end == nullptr || *end != '\0' || p <= 0 || p > 65535)
    throw Error(Error::Kind::Usage, "group rank 0's contact must be 'address:port' (got '" + contact + "')");
  addr = contact.substr(0, colon);
  port = (int)p;
}

// ---- the star at rank 0 -------------------------------------------------------

namespace {

void send_blob(int fd, const std::string& bytes, int peer, int t) {
  const uint64_t n = bytes.size();
  net::send_all(fd, &n, sizeof n, peer, t, "init");
  if (n) net::send_all(fd, bytes.data(), n, peer, t, "init");
}

std::string recv_blob(int fd, int peer, int t) {
  uint64_t n = 0;
  net::recv_all(fd, &n, sizeof n, peer, t, "init");
  if (n > (64u << 20)) throw Error(Error::Kind::System, "init: a malformed set-up message");
  std::string out(n, '\0');
  if (n) net::recv_all(fd, &out[0], n, peer, t, "init");
  return out;
}

}  // namespace

Bootstrap::Bootstrap(const Config& c, int listen_fd, const std::string& addr, int port) : cfg_(c) {
  const int t = c.timeout_ms;
  try {
    if (c.rank != 0) {
      master_fd_ = net::connect_to(addr, port, t);
      const int32_t hello = c.rank;
      net::send_all(master_fd_, &hello, sizeof hello, 0, t, "init");
      return;
    }
    member_fds_.assign(c.size, -1);
    for (int got = 1; got < c.size; ++got) {
      int fd = net::accept_one(listen_fd, t);
      if (fd < 0)
        throw Error(Error::Kind::Timeout, "init: only " + std::to_string(got) + " of " +
                                              std::to_string(c.size) +
                                              " ranks connected within the timeout");
      int32_t r = -1;
      try {
        net::recv_all(fd, &r, sizeof r, -1, t, "init");
      } catch (...) {
        net::close_fd(fd);
        throw;
      }
      if (r <= 0 || r >= c.size || member_fds_[r] >= 0) {
        net::close_fd(fd);
        throw Error(Error::Kind::Usage, "init: unexpected rank " + std::to_string(r) +
                                            " (ranks must be 0.." + std::to_string(c.size - 1) +
                                            ", each once)");
      }
      member_fds_[r] = fd;
    }
  } catch (...) {
    net::close_fd(listen_fd);
    net::close_fd(master_fd_);
    for (int fd : member_fds_) net::close_fd(fd);
    throw;
  }
  net::close_fd(listen_fd);
}

Bootstrap::~Bootstrap() {
  net::close_fd(master_fd_);
  for (int fd : member_fds_) net::close_fd(fd);
}

std::vector<std::string> Bootstrap::allgather(const std::string& mine) {
  const int t = cfg_.timeout_ms;
  std::vector<std::string> all(cfg_.size);
  if (cfg_.rank != 0) {
    send_blob(master_fd_, mine, 0, t);
    for (auto& one : all) one = recv_blob(master_fd_, 0, t);
    return all;
  }
  all[0] = mine;
  for (int r = 1; r < cfg_.size; ++r) all[r] = recv_blob(member_fds_[r], r, t);
  for (int r = 1; r < cfg_.size; ++r)
    for (const auto& one : all) send_blob(member_fds_[r], one, r, t);
  return all;
}

std::string Bootstrap::local_address() const {
  return master_fd_ >= 0 ? net::local_address(master_fd_) : std::string();
}

void Job::close_all() {
  for (int& fd : links) net::close_fd(fd), fd = -1;
  for (int& fd : mesh) net::close_fd(fd), fd = -1;
  for (int& fd : control) net::close_fd(fd), fd = -1;
}

namespace {

std::vector<RankRecord> exchange_table(const Config& c, Bootstrap& boot, const RankRecord& mine) {
  const auto all = boot.allgather(std::string(reinterpret_cast<const char*>(&mine), sizeof mine));
  std::vector<RankRecord> table(c.size);
  for (int r = 0; r < c.size; ++r) {
    if (all[r].size() != sizeof(RankRecord))
      throw Error(Error::Kind::Usage, "init: rank " + std::to_string(r) +
                                          " runs a different Shoal build (record size)");
    std::memcpy(&table[r], all[r].data(), sizeof(RankRecord));
  }
  return table;
}

// Ranks group into hosts by name. Hosts with different numbers of ranks (a
// group that takes some ranks of each host) are cut into virtual hosts of the
// greatest common size, so that every host of the algorithms has the same
// number of local ranks; virtual hosts on one machine talk over TCP.
void build_topology(const Config& c, Job& job) {
  std::map<std::string, int> index;
  std::vector<std::vector<int>> hosts;
  for (int r = 0; r < c.size; ++r) {
    auto it = index.emplace(job.table[r].host, (int)hosts.size()).first;
    if (it->second == (int)hosts.size()) hosts.emplace_back();
    hosts[it->second].push_back(r);
  }
  std::size_t g = 0;
  for (const auto& h : hosts) g = std::gcd(g, h.size());
  for (const auto& h : hosts)
    for (std::size_t lo = 0; lo < h.size(); lo += g)
      job.host_ranks.emplace_back(h.begin() + lo, h.begin() + lo + g);
  Topology& t = job.topo;
  t.rank = c.rank;
  t.size = c.size;
  t.global_rank = c.global_rank;
  t.host = c.host;
  t.num_hosts = (int)job.host_ranks.size();
  t.local_size = (int)g;
  for (int h = 0; h < t.num_hosts; ++h) {
    const auto& ranks = job.host_ranks[h];
    const auto it = std::find(ranks.begin(), ranks.end(), c.rank);
    if (it != ranks.end()) t.host_index = h, t.local_rank = (int)(it - ranks.begin());
  }
}

// Ranks with the same local rank on different hosts form a full mesh: the
// higher host index connects, the lower accepts. Each pair has two
// connections: data (raw bytes) and control (failure notices, net.h). Every
// pair of ranks on different hosts also has a point-to-point connection
// (channel 2), so that a transfer never waits behind a collective.
void connect_mesh(const Config& c, Job& job, int data_listen) {
  const Topology& t = job.topo;
  job.mesh.assign(t.num_hosts, -1);
  job.control.assign(t.num_hosts, -1);
  job.links.assign(t.size, -1);
  auto dial = [&](int rank, int channel) {
    const RankRecord& peer = job.table[rank];
    int fd = net::connect_to(peer.addr, peer.port, c.timeout_ms);
    const int hello[3] = {t.host_index, channel, c.rank};
    try {
      net::send_all(fd, hello, sizeof hello, peer.global, c.timeout_ms, "init");
    } catch (...) {
      net::close_fd(fd);
      throw;
    }
    return fd;
  };
  for (int h = 0; h < t.host_index; ++h) {
    job.mesh[h] = dial(job.host_ranks[h][t.local_rank], 0);
    job.control[h] = dial(job.host_ranks[h][t.local_rank], 1);
    for (int r : job.host_ranks[h]) job.links[r] = dial(r, 2);
  }
  int expected = 0;
  for (int h = t.host_index + 1; h < t.num_hosts; ++h) expected += 2 + (int)job.host_ranks[h].size();
  for (; expected > 0; --expected) {
    int fd = net::accept_one(data_listen, c.timeout_ms);
    if (fd < 0) throw Error(Error::Kind::Timeout, "init: a peer host did not connect in time");
    int hello[3] = {-1, -1, -1};
    try {
      net::recv_all(fd, hello, sizeof hello, -1, c.timeout_ms, "init");
    } catch (...) {
      net::close_fd(fd);
      throw;
    }
    const int from = hello[0], channel = hello[1], rank = hello[2];
    bool known = from > t.host_index && from < t.num_hosts && channel >= 0 && channel <= 2 &&
                 rank >= 0 && rank < t.size;
    int* slot = nullptr;
    if (known) slot = channel == 2 ? &job.links[rank] : &(channel == 1 ? job.control : job.mesh)[from];
    if (!known || *slot >= 0) {
      net::close_fd(fd);
      throw Error(Error::Kind::Usage, "init: unexpected mesh connection from host " +
                                          std::to_string(from));
    }
    *slot = fd;
  }
}

}  // namespace

Job rendezvous(const Config& c, Bootstrap& boot, const std::string& advertised) {
  Job job;
  const std::string bind_addr = c.interface.empty() ? std::string() : advertised;
  int data_listen = net::listen_on(bind_addr, 0, 1024);
  try {
    RankRecord mine{};
    mine.rank = c.rank;
    mine.global = c.global_rank;
    mine.pid = (int)getpid();
    mine.port = net::bound_port(data_listen);
    copy_field(mine.host, sizeof mine.host, c.host, "SHOAL_HOST");
    copy_field(mine.addr, sizeof mine.addr, advertised, "address");
    job.table = exchange_table(c, boot, mine);
    build_topology(c, job);
    if (job.topo.num_hosts > 1) connect_mesh(c, job, data_listen);
  } catch (...) {
    net::close_fd(data_listen);
    job.close_all();
    throw;
  }
  net::close_fd(data_listen);
  return job;
}

}  // namespace shoal
