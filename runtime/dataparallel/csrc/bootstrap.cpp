// Configuration and rendezvous (see bootstrap.h).
#include "bootstrap.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>

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
  return c;
}

void Job::barrier(int timeout_ms) {
  char token = 1;
  if (topo.rank == 0) {
    for (std::size_t r = 1; r < member_fds.size(); ++r)
      net::recv_all(member_fds[r], &token, 1, (int)r, timeout_ms, "init barrier");
    for (std::size_t r = 1; r < member_fds.size(); ++r)
      net::send_all(member_fds[r], &token, 1, (int)r, timeout_ms, "init barrier");
  } else {
    net::send_all(master_fd, &token, 1, 0, timeout_ms, "init barrier");
    net::recv_all(master_fd, &token, 1, 0, timeout_ms, "init barrier");
  }
}

void Job::close_all() {
  net::close_fd(master_fd);
  master_fd = -1;
  for (int& fd : member_fds) net::close_fd(fd), fd = -1;
  for (int& fd : mesh) net::close_fd(fd), fd = -1;
  for (int& fd : control) net::close_fd(fd), fd = -1;
}

namespace {

// Rank 0 gathers every rank's record and sends the full table back.
std::vector<RankRecord> exchange_table(const Config& c, Job& job, RankRecord mine,
                                       int master_listen) {
  std::vector<RankRecord> table(c.size);
  table[c.rank] = mine;
  const int t = c.timeout_ms;
  if (c.rank == 0) {
    job.member_fds.assign(c.size, -1);
    for (int got = 1; got < c.size; ++got) {
      int fd = net::accept_one(master_listen, t);
      if (fd < 0)
        throw Error(Error::Kind::Timeout, "init: only " + std::to_string(got) + " of " +
                                              std::to_string(c.size) +
                                              " ranks connected within the timeout");
      RankRecord rec;
      net::recv_all(fd, &rec, sizeof rec, -1, t, "init");
      if (rec.rank <= 0 || rec.rank >= c.size || job.member_fds[rec.rank] >= 0)
        throw Error(Error::Kind::Usage, "init: unexpected rank " + std::to_string(rec.rank) +
                                            " (ranks must be 0.." + std::to_string(c.size - 1) +
                                            ", each once)");
      job.member_fds[rec.rank] = fd;
      table[rec.rank] = rec;
    }
    for (int r = 1; r < c.size; ++r)
      net::send_all(job.member_fds[r], table.data(), sizeof(RankRecord) * c.size, r, t, "init");
  } else {
    job.master_fd = net::connect_to(c.master_addr, c.master_port, t);
    if (mine.addr[0] == '\0')
      copy_field(mine.addr, sizeof mine.addr, net::local_address(job.master_fd), "address");
    net::send_all(job.master_fd, &mine, sizeof mine, 0, t, "init");
    net::recv_all(job.master_fd, table.data(), sizeof(RankRecord) * c.size, 0, t, "init");
  }
  return table;
}

void build_topology(const Config& c, Job& job) {
  std::map<std::string, int> index;
  for (int r = 0; r < c.size; ++r) {
    std::string h = job.table[r].host;
    auto it = index.find(h);
    if (it == index.end()) {
      it = index.emplace(h, (int)job.host_ranks.size()).first;
      job.host_ranks.emplace_back();
    }
    job.host_ranks[it->second].push_back(r);
  }
  Topology& t = job.topo;
  t.rank = c.rank;
  t.size = c.size;
  t.host = c.host;
  t.host_index = index.at(c.host);
  t.num_hosts = (int)job.host_ranks.size();
  const auto& mine = job.host_ranks[t.host_index];
  t.local_size = (int)mine.size();
  t.local_rank = (int)(std::find(mine.begin(), mine.end(), c.rank) - mine.begin());
  for (const auto& h : job.host_ranks)
    if ((int)h.size() != t.local_size)
      throw Error(Error::Kind::Usage,
                  "every host must run the same number of ranks (host '" +
                      std::string(job.table[h[0]].host) + "' has " + std::to_string(h.size()) +
                      ", host '" + c.host + "' has " + std::to_string(t.local_size) + ")");
}

// Ranks with the same local rank on different hosts form a full mesh: the
// higher host index connects, the lower accepts. Each pair has two
// connections: data (raw bytes) and control (failure notices, net.h).
void connect_mesh(const Config& c, Job& job, int data_listen) {
  const Topology& t = job.topo;
  job.mesh.assign(t.num_hosts, -1);
  job.control.assign(t.num_hosts, -1);
  for (int h = 0; h < t.host_index; ++h) {
    const RankRecord& peer = job.table[job.host_ranks[h][t.local_rank]];
    for (int channel = 0; channel < 2; ++channel) {
      int fd = net::connect_to(peer.addr, peer.port, c.timeout_ms);
      (channel == 0 ? job.mesh : job.control)[h] = fd;
      const int hello[2] = {t.host_index, channel};
      net::send_all(fd, hello, sizeof hello, peer.rank, c.timeout_ms, "init");
    }
  }
  for (int n = 2 * (t.num_hosts - 1 - t.host_index); n > 0; --n) {
    int fd = net::accept_one(data_listen, c.timeout_ms);
    if (fd < 0) throw Error(Error::Kind::Timeout, "init: a peer host did not connect in time");
    int hello[2] = {-1, -1};
    try {
      net::recv_all(fd, hello, sizeof hello, -1, c.timeout_ms, "init");
    } catch (...) {
      net::close_fd(fd);
      throw;
    }
    const int from = hello[0];
    const bool known = from > t.host_index && from < t.num_hosts && (hello[1] == 0 || hello[1] == 1);
    std::vector<int>& slot = hello[1] == 1 ? job.control : job.mesh;
    if (!known || slot[from] >= 0) {
      net::close_fd(fd);
      throw Error(Error::Kind::Usage, "init: unexpected mesh connection from host " +
                                          std::to_string(from));
    }
    slot[from] = fd;
  }
}

}  // namespace

Job rendezvous(const Config& c) {
  Job job;
  std::string bind_addr;
  if (!c.interface.empty()) {
    bind_addr = net::interface_address(c.interface);
    if (bind_addr.empty())
      throw Error(Error::Kind::Usage, "SHOAL_NETWORK_INTERFACE '" + c.interface +
                                          "' has no IPv4 address on host " + c.host);
  }
  int master_listen = -1;
  if (c.rank == 0) master_listen = net::listen_on("", c.master_port, 1024);
  int data_listen = net::listen_on(bind_addr, 0, 1024);
  try {
    RankRecord mine{};
    mine.rank = c.rank;
    mine.pid = (int)getpid();
    mine.port = net::bound_port(data_listen);
    copy_field(mine.host, sizeof mine.host, c.host, "SHOAL_HOST");
    std::string advertised = bind_addr;
    if (advertised.empty() && c.rank == 0) advertised = net::resolve(c.master_addr);
    copy_field(mine.addr, sizeof mine.addr, advertised, "address");
    job.table = exchange_table(c, job, mine, master_listen);
    build_topology(c, job);
    if (job.topo.num_hosts > 1) connect_mesh(c, job, data_listen);
  } catch (...) {
    net::close_fd(master_listen);
    net::close_fd(data_listen);
    job.close_all();
    throw;
  }
  net::close_fd(master_listen);
  net::close_fd(data_listen);
  return job;
}

}  // namespace shoal
