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

// Where this process sits in the job. Hosts are numbered in order of their
// lowest global rank; local ranks in order of global rank within a host.
struct Topology {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int host_index = 0;
  int num_hosts = 1;
  std::string host;  // SHOAL_HOST, or the machine's hostname
};

class Error : public std::runtime_error {
 public:
  enum class Kind { Timeout, PeerLost, Usage, System };
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
};
using WorkPtr = std::shared_ptr<Work>;

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
bool is_initialized();
// Throws Usage if not initialized; the reference is valid until shutdown().
const Topology& topology();
// Local cleanup only (no collective): drains queued work, stops the worker,
// unmaps memory, closes sockets. init() may be called again afterwards (all
// ranks together).
void shutdown();

// In place on `data` (count elements). Queued allreduces of the same dtype and
// op are packed into fusion buffers of up to SHOAL_FUSION_THRESHOLD_BYTES; a
// buffer starts when it is full, or when its results are needed (wait() on one
// of its handles, a synchronous collective, flush()). The packing depends only
// on the order of calls, never on timing, so all ranks agree.
WorkPtr allreduce_async(void* data, std::size_t count, DType dtype, ReduceOp op);
void allreduce(void* data, std::size_t count, DType dtype, ReduceOp op);

// `data` holds `bytes` bytes; after the call every rank holds root's bytes.
WorkPtr broadcast_async(void* data, std::size_t bytes, int root);
void broadcast(void* data, std::size_t bytes, int root);

// `recv` holds size * bytes_per_rank bytes; rank r's `send` lands at r * bytes_per_rank.
WorkPtr allgather_async(const void* send, void* recv, std::size_t bytes_per_rank);
void allgather(const void* send, void* recv, std::size_t bytes_per_rank);

// In place on root; the other ranks' buffers are left unchanged.
WorkPtr reduce_async(void* data, std::size_t count, DType dtype, ReduceOp op, int root);
void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root);

void barrier();
// Starts every queued allreduce now (closes the open fusion buffer).
void flush();

}  // namespace shoal
