// Point-to-point transfers of one communicator: send and receive with tags,
// receive from any source (core.h, Group::send_async / recv_async).
//
// Inside a host, through mailboxes in the host segment: every ordered pair of
// local ranks has a ring of slots. A message of up to kInline bytes travels
// inline in one slot (the send completes once it is posted). A larger one,
// where local ranks may read each other's memory, posts only its address: the
// receiver reads the bytes straight into the matched buffer (process_vm_readv,
// no staging copy) and acknowledges. Otherwise it travels in fragments.
// Across hosts, each pair of ranks has a TCP connection of its own: a header,
// then the bytes, written as the socket takes them and read straight into the
// matched buffer.
//
// Matching follows MPI's rules: for one source and tag, messages match
// receives in the order both were issued; a message that arrives before its
// receive waits in the unexpected list (its bytes, or only its address).
//
// Progress: a thread that waits on a transfer drives all of them (one mutex);
// a background thread drives them while transfers are pending and nobody
// waits, so that futures complete on their own.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap.h"
#include "shm.h"
#include "shoal/core.h"

namespace shoal {

class P2P {
 public:
  // Bytes of the mailbox area for `local_size` ranks (HostSegment's extra area).
  static std::size_t area_bytes(int local_size);

  // `links`: per rank of the communicator, the connection to it (-1 on the
  // same host); not owned. `can_read`: local peers' memory is readable.
  P2P(const Job& job, const Config& cfg, HostSegment& seg, std::vector<int> links, bool can_read);
  ~P2P();
  P2P(const P2P&) = delete;
  P2P& operator=(const P2P&) = delete;

  WorkPtr send(const void* data, std::size_t bytes, int peer, int tag);
  WorkPtr recv(void* data, std::size_t bytes, int peer, int tag);  // peer -1: any source

  struct Op;
  struct Message;
  struct Link;

  bool cancel(Op& op);  // an unmatched receive (Work::cancel)

 private:
  friend struct Op;
  void progress();                      // with mu_ held
  void drain(int local);                // one local source's mailbox
  bool post(Op& op);                    // a local send's next slot; true when done posting
  void pump(Link& link);                // a connection's reads and writes
  void deliver(const std::shared_ptr<Message>& m);
  void bind(const std::shared_ptr<Message>& m, const std::shared_ptr<Op>& recv);
  void fill(Message& m, const char* bytes, std::size_t n);
  void read_address(Message& m);
  void acknowledge(const Message& m);
  void check_peers();
  void fail_ops(int peer, const Error& e);
  void ring(int local);
  void wait_for_bell(uint32_t seen, int ms);
  uint32_t bell() const;
  void wait(Op& op);
  void background();
  void enqueue(const std::shared_ptr<Op>& op);

  const Job& job_;
  const Config& cfg_;
  HostSegment& seg_;
  bool can_read_;
  int L_ = 1, me_ = 0;
  char* area_ = nullptr;
  std::vector<int> local_of_;  // by rank: its local rank on this host, or -1

  std::mutex mu_;
  std::condition_variable pending_cv_;
  std::vector<std::deque<std::shared_ptr<Op>>> outbox_;  // local sends, per local destination
  std::vector<uint64_t> next_slot_, drained_, next_id_;   // per local peer
  std::vector<std::shared_ptr<Message>> assembling_;      // per local source: fragments to come
  std::vector<std::unique_ptr<Link>> links_;              // by rank (null: same host)
  std::deque<std::shared_ptr<Op>> posted_;                // receives without a message
  std::deque<std::shared_ptr<Message>> unexpected_;       // messages without a receive
  std::vector<std::shared_ptr<Op>> awaiting_ack_;         // address sends read by the peer
  std::size_t open_ = 0;                                  // transfers not yet complete
  std::chrono::steady_clock::time_point last_check_{};
  bool stopping_ = false;
  bool background_awake_ = false;
  std::thread thread_;
};

}  // namespace shoal
