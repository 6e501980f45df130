// A c10d Backend over Shoal's collective core, for CPU tensors.
//
// torch.distributed dispatches collectives of a process group created with
// backend="shoal" to this class; DistributedDataParallel's C++ reducer needs a
// real c10d Backend (a Python ProcessGroup is not enough), and its comm hooks
// chain on Work::getFuture(). The class is thin glue: it maps tensors and ops
// to the core's API (shoal/core.h), which owns the communicator, the fusion
// buffers and the worker thread.
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
#include <deque>
#include <functional>
#include <mutex>
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

 private:
  Completer() : thread_([this] { run(); }) { thread_.detach(); }

  void run() {
    for (;;) {
      Pending pending;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return !queue_.empty(); });
        pending = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        for (auto& handle : pending.handles) await(handle);
        if (pending.finish) pending.finish();
        pending.work->complete();
      } catch (...) {
        pending.work->fail(std::current_exception());
      }
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
  std::deque<Pending> queue_;
  std::thread thread_;
};

// ---- the backend ------------------------------------------------------------

class ProcessGroupShoal : public c10d::Backend {
 public:
  ProcessGroupShoal(int rank, int size) : c10d::Backend(rank, size) {}

  const std::string getBackendName() const override { return "shoal"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    check_single(tensors);
    return reduce_tensors(tensors, to_op(opts.reduceOp), OpType::ALLREDUCE);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    for (const auto& tensor : tensors) check_cpu(tensor);
    return reduce_tensors(tensors, to_op(opts.reduceOp), OpType::ALLREDUCE_COALESCED);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
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

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& /*opts*/) override {
    check_single(inputs);
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "shoal backend: allgather needs one output list of world_size tensors");
    at::Tensor input = inputs[0].contiguous();
    for (const auto& out : outputs[0]) {
      check_cpu(out);
      TORCH_CHECK(out.numel() == input.numel() && out.scalar_type() == input.scalar_type(),
                  "shoal backend: allgather outputs must match the input's size and dtype");
    }
    at::Tensor flat = at::empty({size_ * input.numel()}, input.options());
    std::vector<at::Tensor> targets = outputs[0];
    auto finish = [flat, targets, input]() mutable {
      const int64_t n = input.numel();
      for (size_t r = 0; r < targets.size(); ++r) {
        targets[r].copy_(flat.narrow(0, r * n, n).view(targets[r].sizes()));
      }
    };
    Pending pending{{shoal::allgather_async(input.data_ptr(), flat.data_ptr(), input.nbytes())},
                    finish,
                    c10::make_intrusive<ShoalWork>(rank_, OpType::ALLGATHER, targets)};
    return submit(std::move(pending));
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& /*opts*/) override {
    check_cpu(output);
    check_cpu(input);
    TORCH_CHECK(output.numel() == size_ * input.numel() &&
                    output.scalar_type() == input.scalar_type(),
                "shoal backend: output must hold world_size times the input, same dtype");
    at::Tensor send = input.contiguous();
    at::Tensor flat = output.contiguous();
    Pending pending{{shoal::allgather_async(send.data_ptr(), flat.data_ptr(), send.nbytes())},
                    copy_back(output, flat),
                    c10::make_intrusive<ShoalWork>(rank_, OpType::_ALLGATHER_BASE,
                                                   std::vector<at::Tensor>{output})};
    return submit(std::move(pending));
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    check_single(outputs);
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "shoal backend: reduce_scatter needs one input list of world_size tensors");
    at::Tensor flat = at::cat(flatten_all(inputs[0]));
    return scatter_reduced(outputs[0], flat, to_op(opts.reduceOp), OpType::REDUCE_SCATTER);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    check_cpu(output);
    check_cpu(input);
    TORCH_CHECK(input.numel() == size_ * output.numel(),
                "shoal backend: input must hold world_size times the output");
    at::Tensor flat = input.contiguous().view({-1}).clone();
    return scatter_reduced(output, flat, to_op(opts.reduceOp), OpType::_REDUCE_SCATTER_BASE);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& /*opts*/) override {
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
  void check_root(int64_t root) const {
    TORCH_CHECK(root >= 0 && root < size_, "shoal backend: root rank ", root,
                " is outside the world of ", size_);
  }

  static std::function<void()> copy_back(at::Tensor target, at::Tensor flat) {
    if (flat.data_ptr() == target.data_ptr() && flat.is_same(target)) return nullptr;
    return [target, flat]() mutable { target.copy_(flat); };
  }

  static std::vector<at::Tensor> flatten_all(const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> flats;
    for (const auto& tensor : tensors) {
      check_cpu(tensor);
      flats.push_back(tensor.contiguous().view({-1}));
    }
    return flats;
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
    if (!copies.empty()) {
      pending.finish = [copies]() {
        for (const auto& copy : copies) copy();
      };
    }
    return submit(std::move(pending));
  }

  c10::intrusive_ptr<c10d::Work> scatter_reduced(at::Tensor output, at::Tensor flat,
                                                 shoal::ReduceOp op, OpType type) {
    const int64_t n = output.numel();
    const int64_t offset = rank_ * n;
    auto finish = [output, flat, n, offset]() mutable {
      output.copy_(flat.narrow(0, offset, n).view(output.sizes()));
    };
    Pending pending{{shoal::allreduce_async(flat.data_ptr(), flat.numel(), to_dtype(flat), op)},
                    finish,
                    c10::make_intrusive<ShoalWork>(rank_, type, std::vector<at::Tensor>{output})};
    return submit(std::move(pending));
  }

  c10::intrusive_ptr<c10d::Work> submit(Pending pending) {
    shoal::flush();  // this operation's fusion group ends here, on every rank alike
    auto work = pending.work;
    Completer::instance().submit(std::move(pending));
    return work;
  }
};

// The creator torch calls (through Python) for backend="shoal": the core must
// already be initialized, with the same rank and size torch assigned.
c10::intrusive_ptr<c10d::Backend> create_backend(int rank, int size) {
  TORCH_CHECK(shoal::is_initialized(), "shoal backend: the collective core is not initialized");
  const shoal::Topology& topology = shoal::topology();
  TORCH_CHECK(size == topology.size,
              "shoal backend: only the world group is supported (group of ", size,
              " ranks, world of ", topology.size, ")");
  TORCH_CHECK(rank == topology.rank, "shoal backend: torch rank ", rank,
              " differs from the core's rank ", topology.rank);
  return c10::make_intrusive<ProcessGroupShoal>(rank, size);
}

}  // namespace shoal_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Shoal's c10d backend over the collective core";
  m.def("create_backend", &shoal_torch::create_backend, py::arg("rank"), py::arg("size"),
        "A c10d Backend over the (initialized) core for the world group.");
}
