// A c10d Backend over Shoal's collective core, for CPU tensors.
//
// torch.distributed dispatches collectives of a process group created with
// backend="shoal" to this class; DistributedDataParallel's C++ reducer needs a
// real c10d Backend (a Python ProcessGroup is not enough), and its comm hooks
// chain on Work::getFuture(). The class is thin glue: it maps tensors and ops
// to the core's API (shoal/core.h), which owns the communicator, the fusion
// buffers and the worker thread. The core offers allreduce, broadcast,
// allgather and reduce; the other collectives are built on them, for
// correctness rather than speed: gather on allgather, scatter on broadcast,
// reduce-scatter on allreduce, all-to-all on allgather. The core's
// communicator spans the whole world, so a group of some of its ranks gets a
// Backend whose every collective fails, naming the call.
//
// Completion: the core's handles only offer test()/wait(), while futures must
// complete on their own (DDP waits on the future, not on the Work). One
// completer thread per process therefore follows the core's handles in issue
// order (the core executes in issue order too), runs the post-processing that
// copies results back into non-contiguous or gathered outputs, and completes
// each future with the output tensors, or with the core's error.
//
// Fusion cuts: the core packs queued allreduces into fusion buffers and cuts a
// buffer at flush() or at a wait() on a pending handle. Every rank must cut at
// the same place, so cuts may only come from the issuing thread, in program
// order: each operation here ends with flush() (an allreduce_coalesced is one
// fused group), and the completer polls test(), which never cuts, instead of
// calling wait() on a pending handle.

#include <shoal/core.h>

#include <torch/extension.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <ATen/core/ivalue.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <numeric>
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

class ShoalWork : public c10d::Work {
 public:
  ShoalWork(int rank, OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override {
    return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
  }
  std::vector<at::Tensor> result() override { return outputs_; }

  bool wait(std::chrono::milliseconds /* timeout: the core's own applies */) override {
    future_->wait();
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  void complete() { future_->markCompleted(c10::IValue(outputs_)); }
  void fail(std::exception_ptr error) { future_->setError(translate(error)); }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

struct Pending {
  std::vector<shoal::WorkPtr> handles;
  std::function<void()> finish;  // copies results into the user's tensors
  c10::intrusive_ptr<ShoalWork> work;
};

// Waits on the core's handles in issue order and completes the futures.
class Completer {
 public:
  static Completer& instance() {
    static Completer* completer = new Completer();  // never destroyed: lives with the process
    return *completer;
  }

  void submit(Pending pending) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(pending));
    }
    ready_.notify_one();
  }

  // Blocks until every submitted operation completed and its future's callbacks ran.
  // Called at interpreter exit (with the GIL released): a callback written in Python
  // (DDP's hooks) that this thread starts once the interpreter is finalizing cannot take
  // the GIL, and the thread is ended from under its C++ frames (std::terminate).
  void drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
  }

 private:
  Completer() : thread_([this] { run(); }) { thread_.detach(); }

  void run() {
    for (;;) {
      {
        Pending pending;
        {
          std::unique_lock<std::mutex> lock(mutex_);
          ready_.wait(lock, [this] { return !queue_.empty(); });
          pending = std::move(queue_.front());
          queue_.pop_front();
          busy_ = true;
        }
        try {
          for (auto& handle : pending.handles) await(handle);
          if (pending.finish) pending.finish();
          pending.work->complete();
        } catch (...) {
          pending.work->fail(std::current_exception());
        }
      }  // the operation's tensors are released before this thread reports idle
      {
        std::lock_guard<std::mutex> lock(mutex_);
        busy_ = false;
      }
      idle_.notify_all();
    }
  }

  // Waits for a handle without cutting the open fusion buffer (see above). It
  // sleeps between polls, with a backoff from 20 us to 500 us, rather than
  // spinning or yielding: the cores belong to the ranks' compute and to the
  // core's own worker, and a yield on a busy machine can cost a time slice.
  static void await(const shoal::WorkPtr& handle) {
    auto pause = std::chrono::microseconds(20);
    while (!handle->test()) {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(500));
    }
    handle->wait();  // already done: returns, or rethrows the operation's error
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::condition_variable idle_;
  std::deque<Pending> queue_;
  bool busy_ = false;
  std::thread thread_;
};

// ---- the backend ------------------------------------------------------------

class ProcessGroupShoal : public c10d::Backend {
 public:
  // `subgroup`: the global ranks of a group smaller than the world, else empty.
  ProcessGroupShoal(int rank, int size, std::vector<int64_t> subgroup = {}, int world = 0)
      : c10d::Backend(rank, size), subgroup_(std::move(subgroup)), world_(world) {}

  const std::string getBackendName() const override { return "shoal"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    check_group("allreduce");
    check_single(tensors);
    return reduce_tensors(tensors, to_op(opts.reduceOp), OpType::ALLREDUCE);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    check_group("allreduce_coalesced");
    for (const auto& tensor : tensors) check_cpu(tensor);
    return reduce_tensors(tensors, to_op(opts.reduceOp), OpType::ALLREDUCE_COALESCED);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    check_group("reduce");
    check_single(tensors);
    check_root(opts.rootRank);
    at::Tensor tensor = tensors[0];
    at::Tensor flat = tensor.contiguous();
    Pending pending{{shoal::reduce_async(flat.data_ptr(), flat.numel(), to_dtype(flat),
                                         to_op(opts.reduceOp), static_cast<int>(opts.rootRank))},
                    copy_back(tensor, flat),
                    c10::make_intrusive<ShoalWork>(rank_, OpType::REDUCE, tensors)};
    return submit(std::move(pending));
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    check_group("broadcast");
    check_single(tensors);
    check_root(opts.rootRank);
    at::Tensor tensor = tensors[0];
    at::Tensor flat = tensor.contiguous();
    Pending pending{{shoal::broadcast_async(flat.data_ptr(), flat.nbytes(),
                                            static_cast<int>(opts.rootRank))},
                    copy_back(tensor, flat),
                    c10::make_intrusive<ShoalWork>(rank_, OpType::BROADCAST, tensors)};
    return submit(std::move(pending));
  }

  // ---- gathering: every rank's tensor to every rank (or to the root) ----------

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& /*opts*/) override {
    check_group("allgather");
    check_single(inputs);
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "shoal backend: allgather needs one output list of world_size tensors");
    check_like(outputs[0], inputs[0], "allgather");
    return gather_into(inputs[0], outputs[0], OpType::ALLGATHER);
  }

  // outputs[r][i]: rank r's inputs[i], as gloo has it. Checked before any is issued.
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& /*opts*/) override {
    check_group("allgather_coalesced");
    TORCH_CHECK(static_cast<int>(outputs.size()) == size_,
                "shoal backend: allgather_coalesced needs world_size output lists");
    std::vector<std::vector<at::Tensor>> targets(inputs.size());
    for (const auto& list : outputs) {
      TORCH_CHECK(list.size() == inputs.size(),
                  "shoal backend: allgather_coalesced needs one output per input in each list");
      for (size_t i = 0; i < inputs.size(); ++i) targets[i].push_back(list[i]);
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_like(targets[i], inputs[i], "allgather_coalesced");
    }
    Pending pending{{}, nullptr, nullptr};
    std::vector<std::function<void()>> copies;
    for (size_t i = 0; i < inputs.size(); ++i) {
      copies.push_back(start_gather(inputs[i], targets[i], pending.handles));
    }
    std::vector<at::Tensor> results;
    for (const auto& list : outputs) results.insert(results.end(), list.begin(), list.end());
    pending.finish = run_all(std::move(copies));
    pending.work = c10::make_intrusive<ShoalWork>(rank_, OpType::ALLGATHER_COALESCED, results);
    return submit(std::move(pending));
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& /*opts*/) override {
    check_group("allgather_into_tensor");
    std::vector<at::Tensor> outputs{output}, inputs{input};
    return allgather_into_tensor_coalesced(outputs, inputs, c10d::AllgatherOptions());
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& /*opts*/) override {
    check_group("allgather_into_tensor_coalesced");
    TORCH_CHECK(outputs.size() == inputs.size(),
                "shoal backend: allgather_into_tensor needs one output per input");
    for (size_t i = 0; i < inputs.size(); ++i) {  // all checked before any is issued
      check_cpu(outputs[i]);
      check_cpu(inputs[i]);
      check_world_sized(outputs[i], inputs[i], size_, kAllgatherSizes);
    }
    Pending pending{{}, nullptr, nullptr};
    std::vector<std::function<void()>> copies;
    for (size_t i = 0; i < inputs.size(); ++i) {
      at::Tensor send = inputs[i].contiguous();
      at::Tensor flat = outputs[i].contiguous();
      pending.handles.push_back(
          shoal::allgather_async(send.data_ptr(), flat.data_ptr(), send.nbytes()));
      if (auto copy = copy_back(outputs[i], flat)) copies.push_back(std::move(copy));
      copies.push_back([send] {});  // a contiguous copy of the input lives until the end
    }
    pending.finish = run_all(std::move(copies));
    pending.work = c10::make_intrusive<ShoalWork>(rank_, OpType::_ALLGATHER_BASE, outputs);
    return submit(std::move(pending));
  }

  // Over the core's allgather: every rank receives all, only the root keeps them.
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    check_group("gather");
    check_single(inputs);
    check_root(opts.rootRank);
    std::vector<at::Tensor> targets;
    if (rank_ == opts.rootRank) {
      TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                  "shoal backend: gather needs one output list of world_size tensors on the "
                  "root");
      targets = outputs[0];
      check_like(targets, inputs[0], "gather");
    } else {
      TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                  "shoal backend: gather takes no output list on ranks other than the root");
    }
    return gather_into(inputs[0], targets, OpType::GATHER);
  }

  // Over the core's broadcast of the root's whole list: each rank keeps its part.
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    check_group("scatter");
    check_single(outputs);
    check_root(opts.rootRank);
    at::Tensor output = outputs[0];
    const int64_t n = output.numel();
    at::Tensor flat;
    if (rank_ == opts.rootRank) {
      TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                  "shoal backend: scatter needs one input list of world_size tensors on the root");
      check_like(inputs[0], output, "scatter");
      flat = at::cat(flatten_all(inputs[0]));
    } else {
      TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                  "shoal backend: scatter takes no input list on ranks other than the root");
      flat = at::empty({size_ * n}, output.options());
    }
    const int64_t offset = rank_ * n;
    auto finish = [output, flat, n, offset]() mutable {
      output.copy_(flat.narrow(0, offset, n).view(output.sizes()));
    };
    Pending pending{{shoal::broadcast_async(flat.data_ptr(), flat.nbytes(),
                                            static_cast<int>(opts.rootRank))},
                    finish, c10::make_intrusive<ShoalWork>(rank_, OpType::SCATTER, outputs)};
    return submit(std::move(pending));
  }

  // ---- reduce-scatter: over the core's allreduce of the whole input ------------

  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    check_group("reduce_scatter");
    check_single(outputs);
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "shoal backend: reduce_scatter needs one input list of world_size tensors");
    check_like(inputs[0], outputs[0], "reduce_scatter");
    at::Tensor flat = at::cat(flatten_all(inputs[0]));
    return scatter_reduced(outputs[0], flat, to_op(opts.reduceOp), OpType::REDUCE_SCATTER);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    check_group("reduce_scatter_tensor");
    check_cpu(output);
    check_cpu(input);
    check_world_sized(input, output, size_, kReduceScatterSizes);
    at::Tensor flat = input.contiguous().view({-1}).clone();
    return scatter_reduced(output, flat, to_op(opts.reduceOp), OpType::_REDUCE_SCATTER_BASE);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    check_group("reduce_scatter_tensor_coalesced");
    TORCH_CHECK(outputs.size() == inputs.size(),
                "shoal backend: reduce_scatter_tensor_coalesced needs one output per input");
    const shoal::ReduceOp op = to_op(opts.reduceOp);
    Pending pending{{}, nullptr, nullptr};
    std::vector<std::function<void()>> copies;
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_cpu(outputs[i]);
      check_cpu(inputs[i]);
      check_world_sized(inputs[i], outputs[i], size_, kReduceScatterSizes);
      to_dtype(inputs[i]);  // fail before issuing any
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      at::Tensor flat = inputs[i].contiguous().view({-1}).clone();
      pending.handles.push_back(
          shoal::allreduce_async(flat.data_ptr(), flat.numel(), to_dtype(flat), op));
      copies.push_back(own_share(outputs[i], flat));
    }
    pending.finish = run_all(std::move(copies));
    pending.work =
        c10::make_intrusive<ShoalWork>(rank_, OpType::REDUCE_SCATTER_TENSOR_COALESCED, outputs);
    return submit(std::move(pending));
  }

  // ---- all-to-all: over the core's allgather of every rank's whole input --------

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& /*opts*/) override {
    check_group("all_to_all_single");
    check_cpu(output);
    check_cpu(input);
    TORCH_CHECK(output.scalar_type() == input.scalar_type(),
                "shoal backend: all_to_all_single: input and output dtypes differ");
    return exchange(split_rows(input, input_splits, "input"),
                    split_rows(output, output_splits, "output"), OpType::ALLTOALL_BASE,
                    {output});
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& /*opts*/) override {
    check_group("all_to_all");
    TORCH_CHECK(static_cast<int>(outputs.size()) == size_ &&
                    static_cast<int>(inputs.size()) == size_,
                "shoal backend: all_to_all needs world_size inputs and world_size outputs");
    for (size_t r = 0; r < inputs.size(); ++r) {
      check_cpu(inputs[r]);
      check_cpu(outputs[r]);
      TORCH_CHECK(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                      outputs[r].scalar_type() == inputs[0].scalar_type(),
                  "shoal backend: all_to_all: every input and output must have the same dtype");
    }
    return exchange(inputs, outputs, OpType::ALLTOALL, outputs);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& /*opts*/) override {
    check_group("barrier");
    auto work = c10::make_intrusive<ShoalWork>(rank_, OpType::BARRIER, std::vector<at::Tensor>{});
    try {
      shoal::barrier();
      work->complete();
    } catch (...) {
      work->fail(std::current_exception());
    }
    return work;
  }

 private:
  // The core's communicator spans the whole world; every rank must take part in
  // every collective, so a smaller group cannot use it.
  void check_group(const char* call) const {
    if (subgroup_.empty()) return;
    std::string ranks;
    for (int64_t r : subgroup_) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    TORCH_CHECK(false, "shoal backend: ", call, " on a subgroup (ranks [", ranks,
                "] of a world of ", world_, ") is not supported: Shoal's collectives always "
                "span the whole world; create subgroups with backend=\"gloo\"");
  }

  void check_root(int64_t root) const {
    TORCH_CHECK(root >= 0 && root < size_, "shoal backend: root rank ", root,
                " is outside the world of ", size_);
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
                                     std::vector<shoal::WorkPtr>& handles) {
    at::Tensor send = input.contiguous();
    at::Tensor flat = at::empty({size_ * send.numel()}, send.options());
    handles.push_back(shoal::allgather_async(send.data_ptr(), flat.data_ptr(), send.nbytes()));
    return [send, flat, targets]() mutable {
      const int64_t n = send.numel();
      for (size_t r = 0; r < targets.size(); ++r) {
        targets[r].copy_(flat.narrow(0, r * n, n).view(targets[r].sizes()));
      }
    };
  }

  c10::intrusive_ptr<c10d::Work> gather_into(const at::Tensor& input,
                                             std::vector<at::Tensor> targets, OpType type) {
    Pending pending{{}, nullptr, c10::make_intrusive<ShoalWork>(rank_, type, targets)};
    pending.finish = start_gather(input, targets, pending.handles);
    return submit(std::move(pending));
  }

  c10::intrusive_ptr<c10d::Work> reduce_tensors(std::vector<at::Tensor>& tensors,
                                                shoal::ReduceOp op, OpType type) {
    Pending pending{{}, nullptr, c10::make_intrusive<ShoalWork>(rank_, type, tensors)};
    std::vector<std::function<void()>> copies;
    for (const auto& tensor : tensors) to_dtype(tensor);  // fail before issuing any
    for (auto& tensor : tensors) {
      at::Tensor flat = tensor.contiguous();
      pending.handles.push_back(
          shoal::allreduce_async(flat.data_ptr(), flat.numel(), to_dtype(flat), op));
      if (auto copy = copy_back(tensor, flat)) copies.push_back(std::move(copy));
    }
    pending.finish = run_all(std::move(copies));
    return submit(std::move(pending));
  }

  // The step that copies this rank's share of the reduced `flat` into `output`.
  std::function<void()> own_share(at::Tensor output, at::Tensor flat) const {
    const int64_t n = output.numel();
    const int64_t offset = rank_ * n;
    return [output, flat, n, offset]() mutable {
      output.copy_(flat.narrow(0, offset, n).view(output.sizes()));
    };
  }

  c10::intrusive_ptr<c10d::Work> scatter_reduced(at::Tensor output, at::Tensor flat,
                                                 shoal::ReduceOp op, OpType type) {
    Pending pending{{shoal::allreduce_async(flat.data_ptr(), flat.numel(), to_dtype(flat), op)},
                    own_share(output, flat),
                    c10::make_intrusive<ShoalWork>(rank_, type, std::vector<at::Tensor>{output})};
    return submit(std::move(pending));
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

  // Byte counts sent by every rank to every rank: row s, column d = s to d.
  std::vector<int64_t> size_table(const std::vector<at::Tensor>& sends) const {
    std::vector<int64_t> mine(size_), table(size_ * size_);
    for (int d = 0; d < size_; ++d) mine[d] = static_cast<int64_t>(sends[d].nbytes());
    try {
      shoal::allgather(mine.data(), table.data(), mine.size() * sizeof(int64_t));
    } catch (...) {
      std::rethrow_exception(translate(std::current_exception()));
    }
    return table;
  }

  // All-to-all over the core: sizes are exchanged first (synchronously, from this
  // thread, so the order of collectives stays the program's), then every rank's
  // packed sends, padded to the largest rank's total, are allgathered and each
  // rank picks out what was addressed to it.
  c10::intrusive_ptr<c10d::Work> exchange(std::vector<at::Tensor> sends,
                                          std::vector<at::Tensor> recvs, OpType type,
                                          std::vector<at::Tensor> outputs) {
    const std::vector<int64_t> table = size_table(sends);
    int64_t width = 0;
    for (int s = 0; s < size_; ++s) {
      width = std::max(width, std::accumulate(table.begin() + s * size_,
                                              table.begin() + (s + 1) * size_, int64_t{0}));
    }
    at::Tensor packed = at::empty({width}, at::kByte);
    int64_t offset = 0;
    for (const auto& send : sends) {
      at::Tensor part = send.contiguous();
      if (part.nbytes() > 0) {
        std::memcpy(packed.data_ptr<uint8_t>() + offset, part.data_ptr(), part.nbytes());
      }
      offset += static_cast<int64_t>(part.nbytes());
    }
    at::Tensor all = at::empty({size_ * width}, at::kByte);
    Pending pending{{}, nullptr, c10::make_intrusive<ShoalWork>(rank_, type, outputs)};
    if (width > 0) {  // every rank computed the same width: all skip together
      pending.handles.push_back(shoal::allgather_async(packed.data_ptr(), all.data_ptr(), width));
    }
    const int me = rank_, size = size_;
    pending.finish = [packed, all, table, width, recvs, me, size]() mutable {
      for (int s = 0; s < size; ++s) {
        const int64_t* row = table.data() + s * size;
        const int64_t start = std::accumulate(row, row + me, int64_t{0});
        TORCH_CHECK(row[me] == static_cast<int64_t>(recvs[s].nbytes()),
                    "shoal backend: all_to_all: rank ", s, " sent ", row[me], " bytes to rank ",
                    me, ", which expected ", recvs[s].nbytes());
        if (row[me] == 0) continue;
        at::Tensor into = recvs[s].is_contiguous() ? recvs[s] : recvs[s].contiguous();
        std::memcpy(into.data_ptr(), all.data_ptr<uint8_t>() + s * width + start, row[me]);
        if (!into.is_same(recvs[s])) recvs[s].copy_(into);
      }
    };
    return submit(std::move(pending));
  }

  c10::intrusive_ptr<c10d::Work> submit(Pending pending) {
    shoal::flush();  // this operation's fusion group ends here, on every rank alike
    auto work = pending.work;
    Completer::instance().submit(std::move(pending));
    return work;
  }

  std::vector<int64_t> subgroup_;
  int world_;
};

// The creator torch calls (through Python) for backend="shoal": the core must
// already be initialized, with the same rank and size torch assigned.
c10::intrusive_ptr<c10d::Backend> create_backend(int rank, int size) {
  TORCH_CHECK(shoal::is_initialized(), "shoal backend: the collective core is not initialized");
  const shoal::Topology& topology = shoal::topology();
  TORCH_CHECK(size == topology.size, "shoal backend: a group of ", size,
              " ranks in a world of ", topology.size, " needs its global ranks (create it "
              "through torch.distributed.new_group)");
  TORCH_CHECK(rank == topology.rank, "shoal backend: torch rank ", rank,
              " differs from the core's rank ", topology.rank);
  return c10::make_intrusive<ProcessGroupShoal>(rank, size);
}

// A group of some of the world's ranks: it exists (torch creates groups on their
// members only, and code may create some it never uses), but every collective on
// it fails, naming the call.
c10::intrusive_ptr<c10d::Backend> create_subgroup_backend(int rank, std::vector<int64_t> ranks,
                                                          int world) {
  TORCH_CHECK(rank >= 0 && rank < static_cast<int>(ranks.size()),
              "shoal backend: group rank ", rank, " is outside the group of ", ranks.size());
  const int size = static_cast<int>(ranks.size());
  return c10::make_intrusive<ProcessGroupShoal>(rank, size, std::move(ranks), world);
}

}  // namespace shoal_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("drain", [] {
    py::gil_scoped_release nogil;
    shoal_torch::Completer::instance().drain();
  }, "Wait until every operation completed and its callbacks ran (for interpreter exit).");
  m.doc() = "Shoal's c10d backend over the collective core";
  m.def("create_backend", &shoal_torch::create_backend, py::arg("rank"), py::arg("size"),
        "A c10d Backend over the (initialized) core for the world group.");
  m.def("create_subgroup_backend", &shoal_torch::create_subgroup_backend, py::arg("rank"),
        py::arg("ranks"), py::arg("world"),
        "A c10d Backend for a group of some of the world's ranks, whose collectives fail.");
}
