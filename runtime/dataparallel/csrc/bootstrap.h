// From a communicator's members to a connected job: configuration, the star
// rendezvous at the group's rank 0, the topology, the inter-host mesh (a data
// and a control connection per peer pair).
//
// Every communicator (the world and each group) starts the same way: its rank
// 0 listens on a socket it has already bound, the others connect to it, and
// the members exchange records through it. Only how the others learn rank 0's
// address differs: MASTER_ADDR:MASTER_PORT for the world from the rank
// environment, the parent communicator for groups made with new_group(), and
// torch's store for process groups. No port is ever picked by one process and
// bound later by another.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "shoal/core.h"

namespace shoal {

struct Config {
  int rank = 0;             // in the communicator
  int size = 1;
  int global_rank = 0;      // in the job (error messages name these)
  std::string host;         // SHOAL_HOST, else the hostname
  std::string job_id;       // SHOAL_JOB_ID, else the launcher's job id
  std::string master_addr;  // MASTER_ADDR, else 127.0.0.1
  int master_port = 0;      // MASTER_PORT, else derived from the job id
  std::string interface;    // SHOAL_NETWORK_INTERFACE
  int timeout_ms = 300000;  // SHOAL_COLLECTIVE_TIMEOUT (seconds), or the group's own
  // Where the time-out comes from, as time-out errors say it (Group::set_timeout).
  std::string timeout_note = "SHOAL_COLLECTIVE_TIMEOUT";
  std::size_t fusion_bytes = 25u << 20;  // SHOAL_FUSION_THRESHOLD_BYTES
  std::size_t chunk_bytes = 256u << 10;  // SHOAL_SHM_CHUNK_BYTES: one slot (cache-sized)
  std::size_t small_bytes = 64u << 10;   // below: one handshake, no reduce-scatter
  int depth = 64;                        // SHOAL_SHM_DEPTH: slot sets (run-ahead window)
  std::size_t single_copy_bytes = 2u << 20;  // SHOAL_SINGLE_COPY_BYTES: read peers directly from here (0: never)
  uint64_t batch_chunks = 4;             // SHOAL_INTERHOST_BATCH: chunks per inter-host exchange

  static Config from_env();
  // The same settings for a communicator of `size` ranks in which this process is `rank`.
  Config member(int rank, int size, int global_rank) const;
  // The address peers on other hosts reach this process at: the interface's,
  // else the one that routes to MASTER_ADDR.
  std::string reachable_address() const;
};

struct RankRecord {
  int rank;
  int global;     // the rank in the job
  int pid;
  int port;       // the data-plane listener
  char addr[64];  // the address peers on other hosts connect to
  char host[128];
};

// The star that carries a communicator's set-up: rank 0 accepts one
// connection per member. Collective among the members; every wait is bounded
// by the timeout.
class Bootstrap {
 public:
  // Rank 0: `listen_fd` is bound and listening (the bootstrap owns it). The
  // others connect to `addr`:`port`.
  Bootstrap(const Config& config, int listen_fd, const std::string& addr, int port);
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;
  // Every member's bytes, by rank.
  std::vector<std::string> allgather(const std::string& mine);
  void barrier() { allgather(std::string()); }
  // Rank > 0: the local address of the connection to rank 0 (it reaches rank 0's host).
  std::string local_address() const;

 private:
  const Config& cfg_;
  int master_fd_ = -1;            // rank > 0
  std::vector<int> member_fds_;   // rank 0: by rank (-1 for itself)
};

// "addr:port" of a bound listener, as group rank 0 publishes it.
std::string contact_of(const std::string& addr, int port);
void parse_contact(const std::string& contact, std::string& addr, int& port);

struct Job {
  Topology topo;
  std::vector<RankRecord> table;              // by rank in the communicator
  std::vector<std::vector<int>> host_ranks;   // ranks of each (virtual) host, ascending
  std::vector<int> mesh;                      // per host index: socket to my peer there (-1: mine)
  std::vector<int> control;                   // per host index: control connection to the same peer
  std::vector<int> links;                     // per rank on another host: point-to-point connection

  int global(int rank) const { return table[rank].global; }
  void close_all();
};

// Exchanges the records through `boot` and connects the mesh. `advertised` is
// the address this rank's peers on other hosts use.
Job rendezvous(const Config& config, Bootstrap& boot, const std::string& advertised);

}  // namespace shoal
