// From the rank environment to a connected job: configuration, the TCP
// rendezvous at MASTER_ADDR:MASTER_PORT, the topology, the inter-host mesh
// (a data and a control connection per peer pair).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "shoal/core.h"

namespace shoal {

struct Config {
  int rank = 0;
  int size = 1;
  std::string host;         // SHOAL_HOST, else the hostname
  std::string job_id;       // SHOAL_JOB_ID, else the launcher's job id
  std::string master_addr;  // MASTER_ADDR, else 127.0.0.1
  int master_port = 0;      // MASTER_PORT, else derived from the job id
  std::string interface;    // SHOAL_NETWORK_INTERFACE
  int timeout_ms = 300000;  // SHOAL_COLLECTIVE_TIMEOUT (seconds)
  std::size_t fusion_bytes = 25u << 20;  // SHOAL_FUSION_THRESHOLD_BYTES
  std::size_t chunk_bytes = 256u << 10;  // SHOAL_SHM_CHUNK_BYTES: one slot (cache-sized)
  std::size_t small_bytes = 64u << 10;   // below: one handshake, no reduce-scatter
  int depth = 64;                        // SHOAL_SHM_DEPTH: slot sets (run-ahead window)
  std::size_t single_copy_bytes = 2u << 20;  // SHOAL_SINGLE_COPY_BYTES: read peers directly from here (0: never)
  uint64_t batch_chunks = 4;             // SHOAL_INTERHOST_BATCH: chunks per inter-host exchange

  static Config from_env();
};

struct RankRecord {
  int rank;
  int pid;
  int port;       // the data-plane listener
  char addr[64];  // the address peers on other hosts connect to
  char host[128];
};

struct Job {
  Topology topo;
  std::vector<RankRecord> table;              // by global rank
  std::vector<std::vector<int>> host_ranks;   // global ranks of each host, ascending
  std::vector<int> mesh;                      // per host index: socket to my peer there (-1: mine)
  std::vector<int> control;                   // per host index: control connection to the same peer
  int master_fd = -1;                         // rank > 0: the rendezvous connection
  std::vector<int> member_fds;                // rank 0: one per rank (-1 for itself)

  // A job-wide barrier over the rendezvous connections (setup only).
  void barrier(int timeout_ms);
  void close_all();
};

Job rendezvous(const Config& config);

}  // namespace shoal
