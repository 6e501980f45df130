// A c10d Backend over Shoal's collective core, for CPU tensors (and accelerator tensors,
// staged through pinned host memory: staging.h).
//
// torch.distributed dispatches collectives of a process group created with
// backend="shoal" to this class; DistributedDataParallel's C++ reducer needs a
// real c10d Backend (a Python ProcessGroup is not enough), and its comm hooks
// chain on Work::getFuture(). The class is thin glue: it maps tensors and ops
// to a communicator of the core (shoal/core.h: the world, or a group over the
// process group's ranks, set up through torch's store), which owns the
// shared memory, the connections, the fusion buffers and the worker thread.
// Every collective and point-to-point call maps to the core's own (allreduce,
// broadcast, allgather, reduce, reduce-scatter, all-to-all, gather, scatter,
// send, recv), which moves only the bytes its result needs.
//
// Two ways through (Issue below). An operation of at most
// SHOAL_TORCH_EAGER_BYTES (256 KiB) on an idle communicator runs on the
// caller's thread and returns completed work: no thread hand-off, so a
// synchronous torch call costs what the core's call costs. Anything larger,
// or issued while the communicator is busy, is queued on the core's thread and
// overlaps the caller's compute (DDP's buckets); its future completes on the
// completer thread, which the core wakes when the operation is done.
//
// Fusion cuts: the core packs queued allreduces into fusion buffers and cuts a
// buffer at flush() or at a wait() on a pending handle. Every rank must cut at
// the same place, so cuts may only come from the issuing thread, in program
// order: each operation here ends with flush() (an allreduce_coalesced is one
// fused group), and completion follows the handles through when_done(), which
// never cuts.
//
// Profiling (activity.h): with SHOAL_PROFILER_DIR set, each operation's work
// leaves a record of its times and bytes when it goes.

#include "activity.h"
#include "staging.h"

#include <shoal/core.h>

#include <torch/extension.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <ATen/core/ivalue.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>

namespace shoal_torch {

using c10d::OpType;

// ---- mapping torch types to the core's ------------------------------------

shoal::DType to_dtype(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat: return shoal::DType::Float32;
    case at::kDouble: return shoal::DType::Float64;
    case at::kHalf: return shoal::DType::Float16;
    case at::kBFloat16: return shoal::DType::BFloat16;
    case at::kInt: return shoal::DType::Int32;
    case at::kLong: return shoal::DType::Int64;
    case at::kByte: return shoal::DType::UInt8;
    default:
      TORCH_CHECK(false, "shoal backend: unsupported dtype ", tensor.scalar_type(),
                  " (supported: float32, float64, float16, bfloat16, int32, int64, uint8)");
  }
}

shoal::ReduceOp to_op(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return shoal::ReduceOp::Sum;
    case c10d::ReduceOp::AVG: return shoal::ReduceOp::Average;
    case c10d::ReduceOp::MIN: return shoal::ReduceOp::Min;
    case c10d::ReduceOp::MAX: return shoal::ReduceOp::Max;
    case c10d::ReduceOp::PRODUCT: return shoal::ReduceOp::Product;
    default:
      TORCH_CHECK(false, "shoal backend: unsupported reduce op (supported: SUM, AVG, MIN, MAX, "
                         "PRODUCT)");
  }
}

void check_cpu(const at::Tensor& tensor) {
  TORCH_CHECK(tensor.device().is_cpu(), "shoal backend: tensors must be on the CPU (got ",
              tensor.device(), ")");
  TORCH_CHECK(!tensor.is_sparse(), "shoal backend: sparse tensors are not supported");
}

constexpr const char* kAllgatherSizes =
    "shoal backend: allgather_into_tensor: the output must hold world_size times the input, "
    "same dtype";
constexpr const char* kReduceScatterSizes =
    "shoal backend: reduce_scatter_tensor: the input must hold world_size times the output, "
    "same dtype";

// The tensor forms of allgather and reduce_scatter: `whole` holds `size` times `part`, same
// dtype. `message` names the call and which tensor is which.
void check_world_sized(const at::Tensor& whole, const at::Tensor& part, int64_t size,
                       const char* message) {
  TORCH_CHECK(whole.numel() == size * part.numel() && whole.scalar_type() == part.scalar_type(),
              message);
}

void check_single(const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK(tensors.size() == 1, "shoal backend: expects one tensor per call (got ",
              tensors.size(), ")");
  check_cpu(tensors[0]);
}

// The core reports errors as shoal::Error; torch code expects c10 errors that
// say what happened. The kind is the message's first word so that Python can
// map it to shoal.errors without parsing anything else.
std::exception_ptr translate(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const shoal::Error& e) {
    const char* kind = "CollectiveError";
    if (e.kind() == shoal::Error::Kind::Timeout) kind = "CollectiveTimeoutError";
    if (e.kind() == shoal::Error::Kind::PeerLost) kind = "PeerLostError";
    return std::make_exception_ptr(
        c10::DistBackendError(std::string(kind) + ": " + e.what(), nullptr));
  } catch (...) {
    return std::current_exception();
  }
}

// ---- work and completion ----------------------------------------------------

// One type object for every future (creating it per operation costs an allocation).
const c10::TypePtr& tensor_list_type() {
  static const c10::TypePtr type = c10::ListType::create(c10::TensorType::get());
  return type;
}

class ShoalWork : public c10d::Work {
 public:
  ShoalWork(int rank, OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(tensor_list_type())) {}
  ~ShoalWork() override {
    if (!tracked_ || activity_.ended == 0) return;
    if (activity_.exposed < 0 && waited_late_.load()) activity_.exposed = 0;
    ActivityLog::instance().record(std::move(activity_));
  }

  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override {
    return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
  }
  std::vector<at::Tensor> result() override { return outputs_; }

  bool wait(std::chrono::milliseconds /* timeout: the core's own applies */) override {
    if (tracked_ && !future_->completed()) {
      int64_t none = 0;
      wait_began_.compare_exchange_strong(none, now_us());
    } else if (tracked_) {
      waited_late_.store(true);  // it returns at once: nothing exposed
    }
    // A transfer is driven by the thread that waits on it: no hand-off to another thread.
    if (transfer_) {
      claimed_.store(true);
      try {
        transfer_->wait();
      } catch (...) {
      }
      settle(finish_);
    }
    future_->wait();
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  int sourceRank() const override {
    TORCH_CHECK(transfer_ && !isSend_, "shoal backend: sourceRank() is only for receives");
    return transfer_->source();
  }

  void complete() {
    stamp_end(true);
    future_->markCompleted(c10::IValue(outputs_));
  }
  void fail(std::exception_ptr error) {
    stamp_end(false);
    future_->setError(translate(error));
  }
  // Profiling on: this work leaves `activity` (issue time, bytes, mode set) when it goes.
  // `last_done` is its group's latest end of an operation.
  void track(Activity activity, std::shared_ptr<std::atomic<int64_t>> last_done) {
    activity_ = std::move(activity), last_done_ = std::move(last_done), tracked_ = true;
  }
  // Runs the copies and completes the future, once, whoever gets here first (the
  // completer thread, or the thread that waits on a transfer).
  void settle(const std::function<void()>& finish) {
    if (settled_.exchange(true)) return;
    try {
      if (transfer_) transfer_->wait();  // done: rethrows its error
      if (finish) finish();
      complete();
    } catch (...) {
      fail(std::current_exception());
    }
  }
  // A thread waits on this transfer and settles it: the completer need not.
  bool claimed() const { return claimed_.load(); }
  // A point-to-point work: its core handle and the step that copies into the user's tensor.
  void set_transfer(shoal::WorkPtr handle, std::function<void()> finish, bool is_send) {
    transfer_ = std::move(handle), finish_ = std::move(finish), isSend_ = is_send;
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<bool> settled_{false};
  std::atomic<bool> claimed_{false};
  shoal::WorkPtr transfer_;
  std::function<void()> finish_;
  bool isSend_ = false;

  // Once, before the future completes (its waiters may drop the work right after).
  void stamp_end(bool ok) {
    if (!tracked_) return;
    Activity& a = activity_;
    a.ended = now_us(), a.ok = ok;
    // point-to-point runs beside the collectives' order: it neither waits for nor delays them
    const bool in_order = a.mode != "transfer" && last_done_;
    const int64_t previous = in_order ? last_done_->exchange(a.ended) : 0;
    a.started = a.mode == "queued" ? std::max(a.issued, std::min(previous, a.ended)) : a.issued;
    const int64_t began = wait_began_.load();
    if (a.mode == "eager") a.exposed = a.ended - a.issued;
    else if (began != 0) a.exposed = std::max<int64_t>(0, a.ended - began);
  }

  bool tracked_ = false;
  Activity activity_;
  std::atomic<int64_t> wait_began_{0};
  std::atomic<bool> waited_late_{false};
  std::shared_ptr<std::atomic<int64_t>> last_done_;
};

struct Pending {
  std::vector<shoal::WorkPtr> handles;
  std::function<void()> finish;  // copies results into the user's tensors
  c10::intrusive_ptr<ShoalWork> work;
};

// Completes the futures of queued operations. The core calls back (on its
// thread) when an operation's last handle is done; this thread then runs the
// copies and completes the future, so that the callbacks chained on it (DDP's
// hooks, in Python) never hold up the core's thread.
class Completer {
 public:
  static Completer& instance() {
    static Completer* completer = new Completer();  // never destroyed: lives with the process
    return *completer;
  }

  void submit(Pending pending) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++outstanding_;
    }
    auto shared = std::make_shared<Pending>(std::move(pending));
    auto left = std::make_shared<std::atomic<size_t>>(shared->handles.size());
    if (shared->handles.empty()) return ready(shared);
    for (auto& handle : shared->handles) {
      handle->when_done([this, shared, left] {
        if (left->fetch_sub(1) != 1) return;
        if (shared->work->claimed()) return settled_elsewhere();  // no wake-up for nothing
        ready(shared);
      });
    }
  }

  // Blocks until every submitted operation completed and its future's callbacks ran.
  // Called at interpreter exit (with the GIL released): a callback written in Python
  // (DDP's hooks) that this thread starts once the interpreter is finalizing cannot take
  // the GIL, and the thread is ended from under its C++ frames (std::terminate).
  void drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [this] { return outstanding_ == 0; });
  }

 private:
  Completer() : thread_([this] { run(); }) { thread_.detach(); }

  void settled_elsewhere() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --outstanding_;
    }
    idle_.notify_all();
  }

  void ready(const std::shared_ptr<Pending>& pending) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(pending);
    }
    ready_.notify_one();
  }

  void run() {
    for (;;) {
      {
        std::shared_ptr<Pending> pending;  // its work may have been settled by a waiter already
        {
          std::unique_lock<std::mutex> lock(mutex_);
          ready_.wait(lock, [this] { return !queue_.empty(); });
          pending = std::move(queue_.front());
          queue_.pop_front();
        }
        try {
          for (auto& handle : pending->handles) handle->wait();  // done: rethrows its error
          pending->work->settle(pending->finish);
        } catch (...) {
          pending->work->settle([error = std::current_exception()] { std::rethrow_exception(error); });
        }
      }  // the operation's tensors are released before this thread reports it done
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --outstanding_;
      }
      idle_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::condition_variable idle_;
  std::deque<std::shared_ptr<Pending>> queue_;
  size_t outstanding_ = 0;
  std::thread thread_;
};

// Where an operation's collectives go: through on the caller's thread (eager)
// or queued on the communicator's thread, collecting their handles.
class Issue {
 public:
  Issue(shoal::Group& group, bool eager) : group_(group), eager(eager) {}
  void allreduce(void* data, size_t count, shoal::DType dtype, shoal::ReduceOp op) {
    if (eager) return group_.allreduce(data, count, dtype, op);
    handles.push_back(group_.allreduce_async(data, count, dtype, op));
  }
  void broadcast(void* data, size_t bytes, int root) {
    if (eager) return group_.broadcast(data, bytes, root);
    handles.push_back(group_.broadcast_async(data, bytes, root));
  }
  void allgather(const void* send, void* recv, size_t bytes) {
    if (eager) return group_.allgather(send, recv, bytes);
    handles.push_back(group_.allgather_async(send, recv, bytes));
  }
  void reduce(void* data, size_t count, shoal::DType dtype, shoal::ReduceOp op, int root) {
    if (eager) return group_.reduce(data, count, dtype, op, root);
    handles.push_back(group_.reduce_async(data, count, dtype, op, root));
  }
  void reduce_scatter(const void* send, void* recv, size_t count, shoal::DType dtype,
                      shoal::ReduceOp op) {
    if (eager) return group_.reduce_scatter(send, recv, count, dtype, op);
    handles.push_back(group_.reduce_scatter_async(send, recv, count, dtype, op));
  }
  void alltoall(const void* send, shoal::Group::Sizes sc, shoal::Group::Sizes so, void* recv,
                shoal::Group::Sizes rc, shoal::Group::Sizes ro) {
    if (eager) return group_.alltoall(send, sc, so, recv, rc, ro);
    handles.push_back(group_.alltoall_async(send, sc, so, recv, rc, ro));
  }
  void gather(const void* send, void* recv, size_t bytes, int root) {
    if (eager) return group_.gather(send, recv, bytes, root);
    handles.push_back(group_.gather_async(send, recv, bytes, root));
  }
  void scatter(const void* send, void* recv, size_t bytes, int root) {
    if (eager) return group_.scatter(send, recv, bytes, root);
    handles.push_back(group_.scatter_async(send, recv, bytes, root));
  }

 private:
  shoal::Group& group_;

 public:
  const bool eager;
  std::vector<shoal::WorkPtr> handles;
};

size_t eager_bytes() {
  static const size_t bytes = [] {
    const char* raw = std::getenv("SHOAL_TORCH_EAGER_BYTES");
    return raw != nullptr && *raw != '\0' ? static_cast<size_t>(std::strtoull(raw, nullptr, 10))
                                          : size_t{256} << 10;
  }();
  return bytes;
}

// An accelerator tensor's allreduce above this size is staged in chunks of it, so that its
// copies and its reduction overlap (staging.h).
size_t staging_chunk_bytes() {
  static const size_t bytes = [] {
    const char* raw = std::getenv("SHOAL_TORCH_STAGING_CHUNK_BYTES");
    return raw != nullptr && *raw != '\0' ? static_cast<size_t>(std::strtoull(raw, nullptr, 10))
                                          : size_t{4} << 20;
  }();
  return std::max<size_t>(bytes, 1);
}

size_t total_bytes(const std::vector<at::Tensor>& tensors) {
  size_t n = 0;
  for (const auto& t : tensors) n += t.nbytes();
  return n;
}

// ---- the backend ------------------------------------------------------------

shoal::Share store_share(c10::intrusive_ptr<c10d::Store> store, int size);
int group_timeout_ms(int64_t timeout_ms);
std::string timeout_note(const std::string& name, int64_t timeout_ms);

// Releases the GIL for a scope where this thread holds it: torch calls the
// backend from Python with the GIL released, and from its own C++ threads.
class WithoutGil {
 public:
  WithoutGil() {
    if (PyGILState_Check()) release_.emplace();
  }

 private:
  std::optional<py::gil_scoped_release> release_;
};

class ProcessGroupShoal : public c10d::Backend {
 public:
  // `release` gives the communicator back (destroys a group, or lets go of the world).
  // `name`: torch's name of the group, which time-out errors give.
  ProcessGroupShoal(int rank, int size, shoal::GroupPtr group, std::function<void()> release,
                    std::string name = "")
      : c10d::Backend(rank, size), group_(std::move(group)), release_(std::move(release)),
        name_(std::move(name)) {}
  ~ProcessGroupShoal() override { shutdown(); }

  const std::string getBackendName() const override { return "shoal"; }

  // Collectives issued on this group so far (torch checks that ranks agree on it).
  void setSequenceNumberForGroup() override { seq_ = 0; }
  uint64_t getSequenceNumberForGroup() override { return seq_; }

  // torch's split_group: a communicator over `ranks` (ranks of this group),
  // set up through the new group's store by its members only.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<Options> getBackendOptions() override {
    return c10::make_intrusive<Options>("shoal");
  }
  // torch's timeout= of the group (0: none given, SHOAL_COLLECTIVE_TIMEOUT applies).
  void setTimeout(std::chrono::milliseconds timeout) override {
    const int ms = group_timeout_ms(timeout.count());
    group_->set_timeout(ms, timeout_note(name_, ms));
  }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& /*opts*/) override {
    const auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it == ranks.end()) return nullptr;
    const int rank = static_cast<int>(it - ranks.begin()), size = static_cast<int>(ranks.size());
    try {
      WithoutGil nogil;
      shoal::GroupPtr group =
          shoal::create_group(rank, size, group_->topology().global_rank, store_share(store, size));
      return c10::make_intrusive<ProcessGroupShoal>(rank, size, group, [group] { group->destroy(); },
                                                    name_ + "/split");
    } catch (const shoal::Error&) {
      std::rethrow_exception(translate(std::current_exception()));
    }
  }

  void shutdown() override {
    if (!release_) return;
    WithoutGil nogil;
    auto release = std::move(release_);
    release_ = nullptr;
    release();
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    if (on_accelerator(tensors)) {
      const size_t chunk = staging_chunk_bytes();
      if (tensors.size() == 1 && tensors[0].is_contiguous() && tensors[0].nbytes() > chunk) {
        const int64_t elements = std::max<int64_t>(1, chunk / tensors[0].element_size());
        return stager_.allreduce_chunks(rank_, tensors[0], elements, [&](at::Tensor& host) {
          std::vector<at::Tensor> one{host};
          return allreduce(one, opts);
        }, without_gil);
      }
      return staged(OpType::ALLREDUCE, tensors, tensors, [&](auto&, auto& host) {
        return allreduce(host, opts);
      });
    }
    check_single(tensors);
    return reduce_tensors(tensors, to_op(opts.reduceOp), OpType::ALLREDUCE);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    if (on_accelerator(tensors)) {
      return staged(OpType::ALLREDUCE_COALESCED, tensors, tensors, [&](auto&, auto& host) {
        return allreduce_coalesced(host, opts);
      });
    }
    for (const auto& tensor : tensors) check_cpu(tensor);
    return reduce_tensors(tensors, to_op(opts.reduceOp), OpType::ALLREDUCE_COALESCED);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    if (on_accelerator(tensors)) {
      return staged(OpType::REDUCE, tensors, tensors, [&](auto&, auto& host) {
        return reduce(host, opts);
      });
    }
    check_single(tensors);
    check_root(opts.rootRank);
    at::Tensor tensor = tensors[0];
    const auto op = to_op(opts.reduceOp);
    const int root = static_cast<int>(opts.rootRank);
    return launch(OpType::REDUCE, tensors, tensor.nbytes(), [&](Issue& issue) {
      at::Tensor flat = tensor.contiguous();
      issue.reduce(flat.data_ptr(), flat.numel(), to_dtype(flat), op, root);
      return copy_back(tensor, flat);
    });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    if (on_accelerator(tensors)) {  // only the root's bytes matter: the others' go up only
      const bool root = rank_ == opts.rootRank;
      return staged(OpType::BROADCAST, root ? tensors : std::vector<at::Tensor>{}, tensors,
                    [&](auto&, auto& host) { return broadcast(host, opts); });
    }
    check_single(tensors);
    check_root(opts.rootRank);
    at::Tensor tensor = tensors[0];
    const int root = static_cast<int>(opts.rootRank);
    return launch(OpType::BROADCAST, tensors, tensor.nbytes(), [&](Issue& issue) {
      at::Tensor flat = tensor.contiguous();
      issue.broadcast(flat.data_ptr(), flat.nbytes(), root);
      return copy_back(tensor, flat);
    });
  }

  // ---- gathering: every rank's tensor to every rank (or to the root) ----------

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& /*opts*/) override {
    if (on_accelerator(inputs) || on_accelerator(flatten(outputs))) {
      return staged(OpType::ALLGATHER, inputs, flatten(outputs), [&](auto& down, auto& up) {
        auto lists = unflatten(up, outputs);
        return allgather(lists, down, c10d::AllgatherOptions());
      });
    }
    check_single(inputs);
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "shoal backend: allgather needs one output list of group-size tensors");
    check_like(outputs[0], inputs[0], "allgather");
    return gather_into(inputs[0], outputs[0], OpType::ALLGATHER);
  }

  // outputs[r][i]: rank r's inputs[i], as gloo has it. Checked before any is issued.
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& /*opts*/) override {
    if (on_accelerator(inputs) || on_accelerator(flatten(outputs))) {
      return staged(OpType::ALLGATHER_COALESCED, inputs, flatten(outputs),
                    [&](auto& down, auto& up) {
                      auto lists = unflatten(up, outputs);
                      return allgather_coalesced(lists, down, c10d::AllgatherOptions());
                    });
    }
    TORCH_CHECK(static_cast<int>(outputs.size()) == size_,
                "shoal backend: allgather_coalesced needs group-size output lists");
    std::vector<std::vector<at::Tensor>> targets(inputs.size());
    for (const auto& list : outputs) {
      TORCH_CHECK(list.size() == inputs.size(),
                  "shoal backend: allgather_coalesced needs one output per input in each list");
      for (size_t i = 0; i < inputs.size(); ++i) targets[i].push_back(list[i]);
    }
    for (size_t i = 0; i < inputs.size(); ++i) check_like(targets[i], inputs[i], "allgather_coalesced");
    std::vector<at::Tensor> results;
    for (const auto& list : outputs) results.insert(results.end(), list.begin(), list.end());
    return launch(OpType::ALLGATHER_COALESCED, results, total_bytes(results), [&](Issue& issue) {
      std::vector<std::function<void()>> copies;
      for (size_t i = 0; i < inputs.size(); ++i) copies.push_back(start_gather(inputs[i], targets[i], issue));
      return run_all(std::move(copies));
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& /*opts*/) override {
    std::vector<at::Tensor> outputs{output}, inputs{input};
    return allgather_into_tensor_coalesced(outputs, inputs, c10d::AllgatherOptions());
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& /*opts*/) override {
    if (on_accelerator(inputs) || on_accelerator(outputs)) {
      return staged(OpType::_ALLGATHER_BASE, inputs, outputs, [&](auto& down, auto& up) {
        return allgather_into_tensor_coalesced(up, down, c10d::AllgatherOptions());
      });
    }
    TORCH_CHECK(outputs.size() == inputs.size(),
                "shoal backend: allgather_into_tensor needs one output per input");
    for (size_t i = 0; i < inputs.size(); ++i) {  // all checked before any is issued
      check_cpu(outputs[i]);
      check_cpu(inputs[i]);
      check_world_sized(outputs[i], inputs[i], size_, kAllgatherSizes);
    }
    return launch(OpType::_ALLGATHER_BASE, outputs, total_bytes(outputs), [&](Issue& issue) {
      std::vector<std::function<void()>> copies;
      for (size_t i = 0; i < inputs.size(); ++i) {
        at::Tensor send = inputs[i].contiguous();
        at::Tensor flat = outputs[i].contiguous();
        issue.allgather(send.data_ptr(), flat.data_ptr(), send.nbytes());
        if (auto copy = copy_back(outputs[i], flat)) copies.push_back(std::move(copy));
        copies.push_back([send] {});  // a contiguous copy of the input lives until the end
      }
      return run_all(std::move(copies));
    });
  }

  // The root receives every rank's tensor (point-to-point, nothing to the others).
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    if (on_accelerator(inputs) || on_accelerator(flatten(outputs))) {
      return staged(OpType::GATHER, inputs, flatten(outputs), [&](auto& down, auto& up) {
        auto lists = unflatten(up, outputs);
        return gather(lists, down, opts);
      });
    }
    check_single(inputs);
    check_root(opts.rootRank);
    const int root = static_cast<int>(opts.rootRank);
    std::vector<at::Tensor> targets;
    if (rank_ == root) {
      TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                  "shoal backend: gather needs one output list of group-size tensors on the "
                  "root");
      targets = outputs[0];
      check_like(targets, inputs[0], "gather");
    } else {
      TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                  "shoal backend: gather takes no output list on ranks other than the root");
    }
    at::Tensor input = inputs[0];
    return launch(OpType::GATHER, targets, input.nbytes() * size_, [&](Issue& issue) {
      at::Tensor send = input.contiguous();
      at::Tensor flat = rank_ == root ? at::empty({size_ * send.numel()}, send.options())
                                      : at::empty({0}, send.options());
      issue.gather(send.data_ptr(), flat.data_ptr(), send.nbytes(), root);
      return std::function<void()>([send, flat, targets]() mutable {
        const int64_t n = send.numel();
        for (size_t r = 0; r < targets.size(); ++r)
          targets[r].copy_(flat.narrow(0, r * n, n).view(targets[r].sizes()));
      });
    });
  }

  // The root sends each rank its tensor (point-to-point).
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    if (on_accelerator(outputs) || on_accelerator(flatten(inputs))) {
      return staged(OpType::SCATTER, flatten(inputs), outputs, [&](auto& down, auto& up) {
        auto lists = unflatten(down, inputs);
        return scatter(up, lists, opts);
      });
    }
    check_single(outputs);
    check_root(opts.rootRank);
    at::Tensor output = outputs[0];
    if (rank_ == opts.rootRank) {
      TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                  "shoal backend: scatter needs one input list of group-size tensors on the root");
      check_like(inputs[0], output, "scatter");
    } else {
      TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                  "shoal backend: scatter takes no input list on ranks other than the root");
    }
    const int root = static_cast<int>(opts.rootRank);
    return launch(OpType::SCATTER, outputs, output.nbytes() * size_, [&](Issue& issue) {
      at::Tensor flat = rank_ == root ? at::cat(flatten_all(inputs[0]))
                                      : at::empty({0}, output.options());
      at::Tensor into = output.contiguous();
      issue.scatter(flat.data_ptr(), into.data_ptr(), into.nbytes(), root);
      auto copy = copy_back(output, into);
      return std::function<void()>([flat, copy] {
        if (copy) copy();
      });
    });
  }

  // ---- reduce-scatter: the core's, half an allreduce's traffic -----------------

  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    if (on_accelerator(outputs) || on_accelerator(flatten(inputs))) {
      return staged(OpType::REDUCE_SCATTER, flatten(inputs), outputs, [&](auto& down, auto& up) {
        auto lists = unflatten(down, inputs);
        return reduce_scatter(up, lists, opts);
      });
    }
    check_single(outputs);
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "shoal backend: reduce_scatter needs one input list of group-size tensors");
    check_like(inputs[0], outputs[0], "reduce_scatter");
    const auto op = to_op(opts.reduceOp);
    at::Tensor output = outputs[0];
    return launch(OpType::REDUCE_SCATTER, outputs, output.nbytes() * size_, [&](Issue& issue) {
      at::Tensor flat = at::cat(flatten_all(inputs[0]));
      at::Tensor into = output.contiguous();
      issue.reduce_scatter(flat.data_ptr(), into.data_ptr(), into.numel(), to_dtype(into), op);
      auto copy = copy_back(output, into);
      return std::function<void()>([flat, copy] {
        if (copy) copy();
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    std::vector<at::Tensor> outputs{output}, inputs{input};
    return reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    if (on_accelerator(inputs) || on_accelerator(outputs)) {
      return staged(OpType::_REDUCE_SCATTER_BASE, inputs, outputs, [&](auto& down, auto& up) {
        return reduce_scatter_tensor_coalesced(up, down, opts);
      });
    }
    TORCH_CHECK(outputs.size() == inputs.size(),
                "shoal backend: reduce_scatter_tensor_coalesced needs one output per input");
    const shoal::ReduceOp op = to_op(opts.reduceOp);
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_cpu(outputs[i]);
      check_cpu(inputs[i]);
      check_world_sized(inputs[i], outputs[i], size_, kReduceScatterSizes);
      to_dtype(inputs[i]);  // fail before issuing any
    }
    const auto type = inputs.size() == 1 ? OpType::_REDUCE_SCATTER_BASE
                                         : OpType::REDUCE_SCATTER_TENSOR_COALESCED;
    return launch(type, outputs, total_bytes(inputs), [&](Issue& issue) {
      std::vector<std::function<void()>> copies;
      for (size_t i = 0; i < inputs.size(); ++i) {
        at::Tensor send = inputs[i].contiguous();
        at::Tensor into = outputs[i].contiguous();
        issue.reduce_scatter(send.data_ptr(), into.data_ptr(), into.numel(), to_dtype(into), op);
        if (auto copy = copy_back(outputs[i], into)) copies.push_back(std::move(copy));
        copies.push_back([send] {});  // the input stays alive until the end
      }
      return run_all(std::move(copies));
    });
  }

  // ---- all-to-all: the core's, each block straight to its rank -----------------

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& /*opts*/) override {
    if (on_accelerator({output, input})) {
      return staged(OpType::ALLTOALL_BASE, {input}, {output}, [&](auto& down, auto& up) {
        return alltoall_base(up[0], down[0], output_splits, input_splits, c10d::AllToAllOptions());
      });
    }
    check_cpu(output);
    check_cpu(input);
    TORCH_CHECK(output.scalar_type() == input.scalar_type(),
                "shoal backend: all_to_all_single: input and output dtypes differ");
    const auto sends = split_rows(input, input_splits, "input");
    const auto recvs = split_rows(output, output_splits, "output");
    return launch(OpType::ALLTOALL_BASE, {output}, input.nbytes() + output.nbytes(),
                  [&](Issue& issue) {
      at::Tensor send = input.contiguous();
      at::Tensor into = output.contiguous();
      issue.alltoall(send.data_ptr(), byte_sizes(sends), byte_offsets(sends), into.data_ptr(),
                     byte_sizes(recvs), byte_offsets(recvs));
      auto copy = copy_back(output, into);
      return std::function<void()>([send, copy] {
        if (copy) copy();
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& /*opts*/) override {
    if (on_accelerator(inputs) || on_accelerator(outputs)) {
      return staged(OpType::ALLTOALL, inputs, outputs, [&](auto& down, auto& up) {
        return alltoall(up, down, c10d::AllToAllOptions());
      });
    }
    TORCH_CHECK(static_cast<int>(outputs.size()) == size_ &&
                    static_cast<int>(inputs.size()) == size_,
                "shoal backend: all_to_all needs group-size inputs and group-size outputs");
    for (size_t r = 0; r < inputs.size(); ++r) {
      check_cpu(inputs[r]);
      check_cpu(outputs[r]);
      TORCH_CHECK(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                      outputs[r].scalar_type() == inputs[0].scalar_type(),
                  "shoal backend: all_to_all: every input and output must have the same dtype");
    }
    return launch(OpType::ALLTOALL, outputs, total_bytes(inputs) + total_bytes(outputs),
                  [&](Issue& issue) {
      at::Tensor send = at::cat(flatten_all(inputs));
      at::Tensor into = at::empty({static_cast<int64_t>(total_bytes(outputs))}, at::kByte);
      issue.alltoall(send.data_ptr(), byte_sizes(inputs), byte_offsets(inputs), into.data_ptr(),
                     byte_sizes(outputs), byte_offsets(outputs));
      std::vector<at::Tensor> targets = outputs;
      return std::function<void()>([send, into, targets]() mutable {
        int64_t at = 0;
        for (auto& t : targets) {
          const int64_t n = static_cast<int64_t>(t.nbytes());
          t.copy_(into.narrow(0, at, n).view(t.scalar_type()).view(t.sizes()));
          at += n;
        }
      });
    });
  }

  // ---- point-to-point: the core's transfers, outside the collectives' order ----

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    if (on_accelerator(tensors)) {
      return staged(OpType::SEND, tensors, {}, [&](auto& down, auto&) {
        return send(down, dst, tag);
      });
    }
    check_single(tensors);
    check_peer(dst, "send");
    at::Tensor flat = tensors[0].contiguous();
    return transfer(OpType::SEND, tensors, [&] {
      return group_->send_async(flat.data_ptr(), flat.nbytes(), dst, tag);
    }, [flat] {}, true);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    if (on_accelerator(tensors)) {
      return staged(OpType::RECV, {}, tensors, [&](auto&, auto& up) { return recv(up, src, tag); });
    }
    check_single(tensors);
    check_peer(src, "recv");
    return receive(tensors, src, tag, OpType::RECV);
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    if (on_accelerator(tensors)) {
      return staged(OpType::RECVANYSOURCE, {}, tensors, [&](auto&, auto& up) {
        return recvAnysource(up, tag);
      });
    }
    check_single(tensors);
    return receive(tensors, shoal::kAnySource, tag, OpType::RECVANYSOURCE);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& /*opts*/) override {
    ++seq_;
    auto work = c10::make_intrusive<ShoalWork>(rank_, OpType::BARRIER, std::vector<at::Tensor>{});
    track(*work, OpType::BARRIER, 0, "eager");
    try {
      WithoutGil nogil;
      group_->barrier();
      work->complete();
    } catch (...) {
      work->fail(std::current_exception());
    }
    return work;
  }

 private:
  // Accelerator tensors: the same operation on pinned host copies (staging.h); a blocking
  // wait for the copies releases the interpreter lock.
  c10::intrusive_ptr<c10d::Work> staged(OpType type, const std::vector<at::Tensor>& down,
                                        const std::vector<at::Tensor>& up, const Stager::Run& run) {
    return stager_.stage(rank_, type, down, up, run, without_gil);
  }

  static void without_gil(const std::function<void()>& wait) {
    WithoutGil nogil;
    wait();
  }

  // Profiling on: `work` records itself (activity.h) from now, its issue.
  void track(ShoalWork& work, OpType type, size_t bytes, const char* mode) {
    if (!activity_on()) return;
    Activity activity;
    activity.issued = now_us();
    activity.name = op_name(type);
    activity.mode = mode;
    activity.bytes = static_cast<int64_t>(bytes);
    activity.across_hosts = across_hosts_;
    work.track(std::move(activity), last_done_);
  }

  // torch's name for the operation, as Python spells it: allreduce, allgather_base, send...
  static std::string op_name(OpType type) {
    std::string name = c10d::opTypeToString(type);
    name.erase(0, name.find_first_not_of('_'));
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return name;
  }

  // Runs `body` (which issues the operation's collectives through an Issue and
  // returns the step that copies results into the user's tensors): eagerly on
  // this thread, or queued, as the header says.
  template <typename Body>
  c10::intrusive_ptr<c10d::Work> launch(OpType type, std::vector<at::Tensor> outputs,
                                        size_t bytes, Body&& body) {
    ++seq_;
    auto work = c10::make_intrusive<ShoalWork>(rank_, type, std::move(outputs));
    Issue issue(*group_, bytes <= eager_bytes() && group_->idle());
    track(*work, type, bytes, issue.eager ? "eager" : "queued");
    std::function<void()> finish;
    try {
      if (!issue.eager) {
        finish = body(issue);
        group_->flush();  // this operation's fusion group ends here, on every rank alike
      } else {
        WithoutGil nogil;
        finish = body(issue);
        if (finish) finish();
        work->complete();
        return work;
      }
    } catch (const shoal::Error&) {
      if (!issue.eager) std::rethrow_exception(translate(std::current_exception()));
      work->fail(std::current_exception());
      return work;
    }
    Completer::instance().submit({std::move(issue.handles), std::move(finish), work});
    return work;
  }

  c10::intrusive_ptr<c10d::Work> receive(std::vector<at::Tensor>& tensors, int src, int tag,
                                         OpType type) {
    at::Tensor tensor = tensors[0];
    at::Tensor flat = tensor.contiguous();
    return transfer(type, tensors, [&] {
      return group_->recv_async(flat.data_ptr(), flat.nbytes(), src, tag);
    }, copy_back(tensor, flat), false);
  }

  // A transfer completes on the waiting thread when someone waits, else on the
  // completer thread (futures chained on it still complete on their own).
  template <typename Start>
  c10::intrusive_ptr<c10d::Work> transfer(OpType type, std::vector<at::Tensor> tensors, Start&& start,
                                          std::function<void()> finish, bool is_send) {
    const size_t bytes = total_bytes(tensors);
    auto work = c10::make_intrusive<ShoalWork>(rank_, type, std::move(tensors));
    track(*work, type, bytes, "transfer");
    shoal::WorkPtr handle;
    try {
      handle = start();
    } catch (const shoal::Error&) {
      std::rethrow_exception(translate(std::current_exception()));
    }
    work->set_transfer(handle, finish, is_send);
    if (handle->test()) {
      work->settle(finish);
      return work;
    }
    Completer::instance().submit({{handle}, std::move(finish), work});
    return work;
  }

  void check_peer(int peer, const char* call) const {
    TORCH_CHECK(peer >= 0 && peer < size_ && peer != rank_, "shoal backend: ", call, ": peer ",
                peer, " is not another rank of the group of ", size_);
  }

  void check_root(int64_t root) const {
    TORCH_CHECK(root >= 0 && root < size_, "shoal backend: root rank ", root,
                " is outside the group of ", size_);
  }

  static void check_like(const std::vector<at::Tensor>& tensors, const at::Tensor& reference,
                         const char* call) {
    check_cpu(reference);
    for (const auto& tensor : tensors) {
      check_cpu(tensor);
      TORCH_CHECK(tensor.numel() == reference.numel() &&
                      tensor.scalar_type() == reference.scalar_type(),
                  "shoal backend: ", call, ": every tensor must have the size and dtype of ",
                  reference.sizes(), " ", reference.scalar_type(), " (got ", tensor.sizes(), " ",
                  tensor.scalar_type(), ")");
    }
  }

  static std::function<void()> copy_back(at::Tensor target, at::Tensor flat) {
    if (flat.data_ptr() == target.data_ptr() && flat.is_same(target)) return nullptr;
    return [target, flat]() mutable { target.copy_(flat); };
  }

  static std::function<void()> run_all(std::vector<std::function<void()>> steps) {
    if (steps.empty()) return nullptr;
    return [steps]() {
      for (const auto& step : steps) step();
    };
  }

  static std::vector<at::Tensor> flatten_all(const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> flats;
    for (const auto& tensor : tensors) {
      check_cpu(tensor);
      flats.push_back(tensor.contiguous().view({-1}));
    }
    return flats;
  }

  // Starts the allgather of `input`; the returned step copies rank r's part into
  // targets[r] (no targets: nothing is kept, as on gather's other ranks).
  std::function<void()> start_gather(const at::Tensor& input, std::vector<at::Tensor> targets,
                                     Issue& issue) {
    at::Tensor send = input.contiguous();
    at::Tensor flat = at::empty({size_ * send.numel()}, send.options());
    issue.allgather(send.data_ptr(), flat.data_ptr(), send.nbytes());
    return [send, flat, targets]() mutable {
      const int64_t n = send.numel();
      for (size_t r = 0; r < targets.size(); ++r) {
        targets[r].copy_(flat.narrow(0, r * n, n).view(targets[r].sizes()));
      }
    };
  }

  c10::intrusive_ptr<c10d::Work> gather_into(const at::Tensor& input,
                                             std::vector<at::Tensor> targets, OpType type) {
    return launch(type, targets, input.nbytes() * size_,
                  [&](Issue& issue) { return start_gather(input, targets, issue); });
  }

  c10::intrusive_ptr<c10d::Work> reduce_tensors(std::vector<at::Tensor>& tensors,
                                                shoal::ReduceOp op, OpType type) {
    for (const auto& tensor : tensors) to_dtype(tensor);  // fail before issuing any
    return launch(type, tensors, total_bytes(tensors), [&](Issue& issue) {
      std::vector<std::function<void()>> copies;
      for (auto& tensor : tensors) {
        at::Tensor flat = tensor.contiguous();
        issue.allreduce(flat.data_ptr(), flat.numel(), to_dtype(flat), op);
        if (auto copy = copy_back(tensor, flat)) copies.push_back(std::move(copy));
      }
      return run_all(std::move(copies));
    });
  }

  // all_to_all_single's split sizes (rows of dim 0; none: equal parts) as views.
  std::vector<at::Tensor> split_rows(const at::Tensor& tensor, std::vector<int64_t> splits,
                                     const char* what) const {
    TORCH_CHECK(tensor.dim() > 0, "shoal backend: all_to_all_single needs tensors of at least "
                                  "one dimension");
    const int64_t rows = tensor.size(0);
    if (splits.empty()) {
      TORCH_CHECK(rows % size_ == 0, "shoal backend: all_to_all_single: the ", what,
                  "'s first dimension (", rows, ") does not divide by the world size ", size_);
      splits.assign(size_, rows / size_);
    }
    TORCH_CHECK(static_cast<int>(splits.size()) == size_,
                "shoal backend: all_to_all_single: ", what, " split sizes need world_size entries");
    std::vector<at::Tensor> parts;
    int64_t start = 0;
    for (int64_t rows_to : splits) {
      TORCH_CHECK(rows_to >= 0 && start + rows_to <= rows, "shoal backend: all_to_all_single: ",
                  what, " split sizes do not fit its first dimension (", rows, ")");
      parts.push_back(tensor.narrow(0, start, rows_to));
      start += rows_to;
    }
    TORCH_CHECK(start == rows, "shoal backend: all_to_all_single: ", what,
                " split sizes sum to ", start, ", not to its first dimension (", rows, ")");
    return parts;
  }

  static shoal::Group::Sizes byte_sizes(const std::vector<at::Tensor>& parts) {
    shoal::Group::Sizes sizes;
    for (const auto& p : parts) sizes.push_back(p.nbytes());
    return sizes;
  }

  static shoal::Group::Sizes byte_offsets(const std::vector<at::Tensor>& parts) {
    shoal::Group::Sizes offsets;
    size_t at = 0;
    for (const auto& p : parts) offsets.push_back(at), at += p.nbytes();
    return offsets;
  }

  shoal::GroupPtr group_;
  std::function<void()> release_;
  const std::string name_;
  std::atomic<uint64_t> seq_{0};
  const bool across_hosts_ = group_->topology().num_hosts > 1;
  // The end of this group's latest operation (profiling: when the next queued one starts).
  const std::shared_ptr<std::atomic<int64_t>> last_done_ = std::make_shared<std::atomic<int64_t>>(0);
  Stager stager_;
};

// ---- creating backends --------------------------------------------------------

// Group rank 0's contact through torch's store. The counter gives every
// incarnation of a group its own key, so that a store reused by a later group
// of the same name never hands out a stale contact; a failure on rank 0 is
// published in its place, so the others fail at once instead of waiting.
shoal::Share store_share(c10::intrusive_ptr<c10d::Store> store, int size) {
  return [store, size](const std::string& contact) {
    const int64_t joined = store->add("shoal/joined", 1);
    const std::string key = "shoal/contact/" + std::to_string((joined - 1) / size);
    if (!contact.empty()) {
      store->set(key, std::vector<uint8_t>(contact.begin(), contact.end()));
      return contact;
    }
    const std::vector<uint8_t> value = store->get(key);
    return std::string(value.begin(), value.end());
  };
}

// torch's timeout= of a group in ms, or 0 for torch's default: torch hands every backend but
// NCCL 30 minutes when the user gives none, and then SHOAL_COLLECTIVE_TIMEOUT (300 s unless
// set) applies. An explicit 30 minutes cannot be told from none.
int group_timeout_ms(int64_t timeout_ms) {
  if (timeout_ms <= 0 || timeout_ms == ::kBackendDefaultTimeout.count()) return 0;
  return static_cast<int>(std::min<int64_t>(timeout_ms, 86400000));
}

// What a time-out error says of where its time-out comes from: the group, and whether torch's
// timeout= (`timeout_ms` > 0) or SHOAL_COLLECTIVE_TIMEOUT set it.
std::string timeout_note(const std::string& name, int64_t timeout_ms) {
  const std::string group = name.empty() ? "group" : "group '" + name + "'";
  return group + (timeout_ms > 0 ? ", timeout set for the group"
                                 : ", timeout from SHOAL_COLLECTIVE_TIMEOUT");
}

std::mutex g_world_mutex;
bool g_world_taken = false;  // a process group runs on the core's world communicator

// torch's creator for backend "shoal": the process group's own communicator,
// set up through its store. The first world-sized group takes the core's world
// (started here if the module API has not), so a script that also calls
// shoal.dataparallel.core shares one communicator with torch's default group.
//
// `timeout_ms` bounds the group's operations (0: SHOAL_COLLECTIVE_TIMEOUT); `name` is torch's.
c10::intrusive_ptr<c10d::Backend> create_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int size,
                                                 std::vector<int64_t> global_ranks,
                                                 int world_size, int64_t timeout_ms,
                                                 const std::string& name) {
  TORCH_CHECK(rank >= 0 && rank < size, "shoal backend: group rank ", rank,
              " is outside the group of ", size);
  TORCH_CHECK(global_ranks.empty() || static_cast<int>(global_ranks.size()) == size,
              "shoal backend: the group's global ranks do not match its size");
  const int global = global_ranks.empty() ? rank : static_cast<int>(global_ranks[rank]);
  const shoal::Share share = store_share(store, size);
  const int timeout = group_timeout_ms(timeout_ms);
  const std::string note = timeout_note(name, timeout);
  py::gil_scoped_release nogil;
  try {
    std::unique_lock<std::mutex> lock(g_world_mutex);
    if (size == world_size && !g_world_taken) {
      const bool started = !shoal::is_initialized();
      const shoal::Topology& t = started ? shoal::init_from(rank, size, share) : shoal::topology();
      if (t.size == size && t.rank == rank) {
        g_world_taken = true;
        auto release = [started] {
          std::lock_guard<std::mutex> guard(g_world_mutex);
          g_world_taken = false;
          if (started) shoal::shutdown();
        };
        shoal::world()->set_timeout(timeout, note);
        return c10::make_intrusive<ProcessGroupShoal>(rank, size, shoal::world(), release, name);
      }
    }
    lock.unlock();
    shoal::GroupPtr group = shoal::create_group(rank, size, global, share);
    group->set_timeout(timeout, note);
    return c10::make_intrusive<ProcessGroupShoal>(rank, size, group, [group] { group->destroy(); },
                                                  name);
  } catch (const shoal::Error&) {
    std::rethrow_exception(translate(std::current_exception()));
  }
}

}  // namespace shoal_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("drain", [] {
    py::gil_scoped_release nogil;
    shoal_torch::Completer::instance().drain();
  }, "Wait until every operation completed and its callbacks ran (for interpreter exit).");
  m.doc() = "Shoal's c10d backend over the collective core";
  m.def("take_activity", [] {
    auto [records, dropped] = shoal_torch::ActivityLog::instance().take();
    py::list out;
    for (const auto& a : records) {
      out.append(py::make_tuple(a.name, a.mode, a.issued, a.started, a.ended, a.exposed, a.bytes,
                                a.across_hosts, a.ok));
    }
    return py::make_tuple(out, dropped);
  }, "The operations recorded since the last call (profiling on: SHOAL_PROFILER_DIR), as "
     "(name, mode, issued_us, started_us, ended_us, exposed_us or -1, bytes, across_hosts, ok), "
     "and how many were dropped.");
  m.def("create_backend", &shoal_torch::create_backend, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("global_ranks"), py::arg("world_size"),
        py::arg("timeout_ms") = 0, py::arg("name") = "",
        "A c10d Backend on its own communicator of the core, set up through `store`.");
}
