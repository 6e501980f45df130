// Shoal collective core: the C++ API shared by the Python binding and the
// framework glue (PyTorch c10d backend, TensorFlow ops).
//
// One process has ONE core state. The core is the shared library
// `libshoal_core<EXT_SUFFIX>` (e.g. libshoal_core.cpython-311-x86_64-linux-gnu.so,
// SONAME the same file name) installed in the `shoal.dataparallel` package
// directory, next to the pybind11 module `shoal.dataparallel._core`, which links
// it with rpath $ORIGIN. Framework glue links the same file, so a torch job that
// also calls the Python API shares one communicator.
//
// How to build against it (torch.utils.cpp_extension, or any compiler):
//   from shoal.dataparallel import core
//   include_dirs = [core.include_dir()]          # this directory's parent
//   extra_ldflags = core.link_flags()            # -L<pkg> -l:<file> -Wl,-rpath,<pkg>
//   (core.library_path() is the absolute path of the shared library.)
// Compile with -std=c++17 -pthread.
//
// Threading: every call may come from any thread. Collectives are executed in
// the order they are issued (program order) by one background thread per
// process; the synchronous forms run inline when nothing is queued. Every rank
// must issue the same collectives, with the same sizes, in the same order.
//
// Errors: every failure throws shoal::Error, whose kind() says whether peers
// timed out (SHOAL_COLLECTIVE_TIMEOUT seconds), a peer died, or the call was
// wrong. After a Timeout or PeerLost error the communicator is broken: later
// collectives fail at once with the same error until shutdown().
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace shoal {

enum class DType : int {
  Float32 = 0,
  Float64 = 1,
  Float16 = 2,   // IEEE half; reduced with fp32 accumulation
  BFloat16 = 3,  // bfloat16 as uint16 bits; reduced with fp32 accumulation
  Int32 = 4,
  Int64 = 5,
  UInt8 = 6,     // raw bytes (broadcast/allgather payloads); Sum wraps
};

enum class ReduceOp : int {
  Sum = 0,
  Average = 1,  // sum divided by world size (integers: truncating division)
  Min = 2,
  Max = 3,
  Product = 4,
};

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
const char* op_name(ReduceOp op);

// Where this process sits in a communicator (the world or a group). Hosts are
// numbered in order of their lowest rank; local ranks in order of rank within a
// host. In a group whose hosts hold different numbers of its ranks, hosts are
// virtual: each machine's ranks cut into pieces of the greatest common size.
struct Topology {
  int rank = 0;         // in the communicator
  int size = 1;
  int global_rank = 0;  // in the job
  int local_rank = 0;
  int local_size = 1;
  int host_index = 0;
  int num_hosts = 1;
  std::string host;  // SHOAL_HOST, or the machine's hostname
};

class Error : public std::runtime_error {
 public:
  enum class Kind { Timeout, PeerLost, Usage, System, Cancelled };
  Error(Kind kind, const std::string& message, std::vector<int> ranks = {})
      : std::runtime_error(message), kind_(kind), ranks_(std::move(ranks)) {}
  Kind kind() const { return kind_; }
  // The global ranks that did not arrive (Timeout) or died (PeerLost).
  const std::vector<int>& ranks() const { return ranks_; }

 private:
  Kind kind_;
  std::vector<int> ranks_;
};

// Handle of an asynchronous collective. wait() blocks until it completed and
// rethrows its error; test() never blocks. Buffers must stay alive and
// untouched until the handle completed.
class Work {
 public:
  virtual ~Work() = default;
  virtual bool test() = 0;
  virtual void wait() = 0;
  // Runs `callback` once the collective completed (successfully or not): on
  // the thread that completed it, or at once on the caller's if it already
  // has. Never cuts a fusion buffer (unlike wait()). Keep it short: the
  // communicator's thread runs it before the next collective.
  virtual void when_done(std::function<void()> callback) = 0;
  // A completed receive: the rank (in its communicator) whose message it got.
  virtual int source() { return -1; }
  // Withdraws a receive that no message has matched yet: it completes at once
  // with a Cancelled error and true is returned. False for anything
  // else (a send, a collective, a receive already matched or complete), which
  // then completes as it would have. A thread blocked on a receive that may
  // never come (a mailbox loop) is released this way before its process ends.
  virtual bool cancel() { return false; }
};

// recv_async's peer for a message from any rank.
constexpr int kAnySource = -1;
using WorkPtr = std::shared_ptr<Work>;

// A communicator over some of the job's ranks: the world, or a group.
// Collectives on one communicator execute in the order they are issued (by
// its own background thread; the synchronous forms inline when nothing is
// queued); different communicators are independent, so ranks may interleave
// their calls on different groups in any order. Ranks and roots are ranks in
// the communicator; errors name ranks in the job.
class Group {
 public:
  virtual ~Group() = default;
  virtual const Topology& topology() const = 0;

  // In place on `data` (count elements). Queued allreduces of the same dtype and
  // op are packed into fusion buffers of up to SHOAL_FUSION_THRESHOLD_BYTES; a
  // buffer starts when it is full, or when its results are needed (wait() on one
  // of its handles, a synchronous collective, flush()). The packing depends only
  // on the order of calls, never on timing, so all ranks agree.
  virtual WorkPtr allreduce_async(void* data, std::size_t count, DType dtype, ReduceOp op) = 0;
  virtual void allreduce(void* data, std::size_t count, DType dtype, ReduceOp op) = 0;
  // `data` holds `bytes` bytes; after the call every rank holds root's bytes.
  virtual WorkPtr broadcast_async(void* data, std::size_t bytes, int root) = 0;
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  // `recv` holds size * bytes_per_rank bytes; rank r's `send` lands at r * bytes_per_rank.
  virtual WorkPtr allgather_async(const void* send, void* recv, std::size_t bytes_per_rank) = 0;
  virtual void allgather(const void* send, void* recv, std::size_t bytes_per_rank) = 0;
  // In place on root; the other ranks' buffers are left unchanged.
  virtual WorkPtr reduce_async(void* data, std::size_t count, DType dtype, ReduceOp op, int root) = 0;
  virtual void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) = 0;
  virtual void barrier() = 0;
  // `recv` holds count elements: the reduction of every rank's elements
  // [rank * count, (rank + 1) * count) of `send`.
  virtual WorkPtr reduce_scatter_async(const void* send, void* recv, std::size_t count, DType dtype,
                                       ReduceOp op) = 0;
  virtual void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                              ReduceOp op) = 0;
  // Bytes, by rank: rank r gets send_counts[r] bytes from `send` + send_offsets[r],
  // and this rank's recv + recv_offsets[r] receives recv_counts[r] bytes from rank r.
  using Sizes = std::vector<std::size_t>;
  virtual WorkPtr alltoall_async(const void* send, Sizes send_counts, Sizes send_offsets, void* recv,
                                 Sizes recv_counts, Sizes recv_offsets) = 0;
  virtual void alltoall(const void* send, Sizes send_counts, Sizes send_offsets, void* recv,
                        Sizes recv_counts, Sizes recv_offsets) = 0;
  // Root's `recv` holds size * bytes: rank r's `send` at r * bytes (others: unused).
  virtual WorkPtr gather_async(const void* send, void* recv, std::size_t bytes, int root) = 0;
  virtual void gather(const void* send, void* recv, std::size_t bytes, int root) = 0;
  // Root's `send` holds size * bytes; rank r receives the block at r * bytes.
  virtual WorkPtr scatter_async(const void* send, void* recv, std::size_t bytes, int root) = 0;
  virtual void scatter(const void* send, void* recv, std::size_t bytes, int root) = 0;
  // Starts every queued allreduce now (closes the open fusion buffer).
  virtual void flush() = 0;
  // Point-to-point, independent of the collectives (any thread, any order):
  // `peer` is a rank of the communicator (recv: or kAnySource); tags are >= 0.
  // For one source
  // and tag, messages match receives in the order both were issued; sizes must
  // agree. Buffers stay alive and untouched until the handle completed. A
  // thread that waits on a handle drives the transfers itself.
  virtual WorkPtr send_async(const void* data, std::size_t bytes, int peer, int tag) = 0;
  virtual WorkPtr recv_async(void* data, std::size_t bytes, int peer, int tag) = 0;
  // Nothing queued or running: a synchronous call would run on the caller's thread.
  virtual bool idle() = 0;
  // Bounds every later collective, barrier and point-to-point transfer of this
  // communicator by `timeout_ms` (> 0; otherwise SHOAL_COLLECTIVE_TIMEOUT's value
  // stays), for a framework's per-group time-out (torch's timeout=). Time-out
  // errors then say "(<note>)", e.g. "group '3', timeout set for the group".
  // Call it before the communicator's first operation.
  virtual void set_timeout(int timeout_ms, const std::string& note) = 0;
  // Local cleanup only (no collective): drains queued work, stops the worker,
  // unmaps memory, closes sockets. Later calls fail with a Usage error. Also
  // done when the last reference goes.
  virtual void destroy() = 0;
};
using GroupPtr = std::shared_ptr<Group>;

// Group rank 0 calls it with its contact ("address:port", already bound);
// the other members call it with "" and get rank 0's. How it travels is the
// caller's: torch's store, the parent communicator, a file.
using Share = std::function<std::string(const std::string& contact)>;

// Creates a communicator of `size` ranks in which this process is `rank`
// (`global_rank` in the job); collective among its members only.
GroupPtr create_group(int rank, int size, int global_rank, const Share& share);
// Collective over every rank of `parent`, each passing the same `ranks`
// (parent ranks, unique, any order: their order gives the group ranks).
// Members get the group; the others get nullptr (the non-member handle).
GroupPtr new_group(const GroupPtr& parent, const std::vector<int>& ranks);

// Reads the rank environment (RANK/WORLD_SIZE or OMPI_COMM_WORLD_RANK/SIZE,
// MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default derived from the job
// id), SHOAL_HOST (default: hostname), SHOAL_JOB_ID (default: mpirun's job id),
// SHOAL_NETWORK_INTERFACE, SHOAL_COLLECTIVE_TIMEOUT (s, default 300),
// SHOAL_FUSION_THRESHOLD_BYTES (default 25 MiB; 0 disables fusion), and the
// tuning knobs SHOAL_SHM_CHUNK_BYTES (256 KiB), SHOAL_SHM_DEPTH (64),
// SHOAL_SMALL_BYTES (64 KiB), SHOAL_SINGLE_COPY_BYTES (2 MiB; 0 disables),
// SHOAL_INTERHOST_BATCH (4), SHOAL_SPIN), groups
// ranks into hosts by SHOAL_HOST (local rank/size come from that grouping),
// bootstraps over TCP (rank 0 listens on MASTER_PORT) and maps the host's
// shared memory. Idempotent: later calls return the same topology.
const Topology& init();
// The same, but the world's rank 0 publishes its contact through `share`
// (torch's store): nothing listens on MASTER_PORT. Idempotent like init().
const Topology& init_from(int rank, int size, const Share& share);
bool is_initialized();
// Throws Usage if not initialized; the reference is valid until shutdown().
const Topology& topology();
// The world communicator (throws Usage if not initialized).
GroupPtr world();
// Local cleanup of the world (see Group::destroy). init() may be called again
// afterwards (all ranks together). Groups live on until destroyed.
void shutdown();

// The world's collectives (see Group).
WorkPtr allreduce_async(void* data, std::size_t count, DType dtype, ReduceOp op);
void allreduce(void* data, std::size_t count, DType dtype, ReduceOp op);
WorkPtr broadcast_async(void* data, std::size_t bytes, int root);
void broadcast(void* data, std::size_t bytes, int root);
WorkPtr allgather_async(const void* send, void* recv, std::size_t bytes_per_rank);
void allgather(const void* send, void* recv, std::size_t bytes_per_rank);
WorkPtr reduce_async(void* data, std::size_t count, DType dtype, ReduceOp op, int root);
void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root);
void barrier();
void flush();

}  // namespace shoal
