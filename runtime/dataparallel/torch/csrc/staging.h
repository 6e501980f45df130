// GPU tensors through the CPU core: host-staged, as SageMaker's data-parallel library does it.
//
// An operation on accelerator (CUDA) tensors is the same operation on pinned host copies of
// them. On a side stream of the device, after the work the caller's current stream has queued
// (an event), the inputs are copied to pinned host memory; once the bytes are on the host the
// CPU operation is issued like any other (eager, or queued on the core's thread). When it
// completes, the results are copied back on the side stream and the work's future, which
// carries the device, completes there: Work::wait() and every callback chained on the future
// (DDP's hooks) order the consumer's stream after the copies, and the caching allocator
// knows the side stream used the tensors (recordDataPtrOnStream), so memory freed by the
// caller is not reused under the copies. Pinned host blocks are held by the host allocator
// until the copies that used them are done.
//
// Everything goes through c10's device-generic interfaces (streams, events, guards): no CUDA
// header, one source for torch's CPU and CUDA builds; the staging path runs only where a
// tensor is on an accelerator, which a CPU-only torch cannot create.

#pragma once

#include <torch/extension.h>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <ATen/core/ivalue.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace shoal_torch {

// True when any of the tensors lives on an accelerator (not the CPU).
inline bool on_accelerator(const std::vector<at::Tensor>& tensors) {
  for (const auto& tensor : tensors) {
    if (tensor.defined() && !tensor.device().is_cpu()) return true;
  }
  return false;
}

inline std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> flat;
  for (const auto& list : lists) flat.insert(flat.end(), list.begin(), list.end());
  return flat;
}

// `flat` cut back into lists shaped like `like`.
inline std::vector<std::vector<at::Tensor>> unflatten(
    const std::vector<at::Tensor>& flat, const std::vector<std::vector<at::Tensor>>& like) {
  std::vector<std::vector<at::Tensor>> lists;
  size_t next = 0;
  for (const auto& list : like) {
    lists.emplace_back(flat.begin() + next, flat.begin() + next + list.size());
    next += list.size();
  }
  return lists;
}

// The work of a staged operation: done when its results are back on the device (on the side
// stream). `inner` is the CPU operation on the host copies.
class StagedWork : public c10d::Work {
 public:
  StagedWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, c10::Device device,
             c10::intrusive_ptr<c10d::Work> inner)
      : c10d::Work(rank, type),
        outputs_(std::move(outputs)),
        inner_(std::move(inner)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()), std::vector<c10::Device>{device})) {}

  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override {
    return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  int sourceRank() const override { return inner_->sourceRank(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // The CPU operation first (it drives a point-to-point transfer and raises its error), then
  // the copies back: the future's wait makes the caller's current stream wait for them.
  bool wait(std::chrono::milliseconds timeout) override {
    inner_->wait(timeout);
    future_->wait();
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }

  // Called with the side stream current: the future records its events there.
  void complete() { future_->markCompleted(c10::IValue(outputs_)); }
  void fail(std::exception_ptr error) { future_->setError(std::move(error)); }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10d::Work> inner_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Stages operations for one backend: one side stream per device, so that a backend's copies
// keep their order.
class Stager {
 public:
  using Run = std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>& down,
                                                          std::vector<at::Tensor>& up)>;

  // Runs `run` on pinned host copies: each of `down` copied to the host first, each of `up`
  // given a host tensor (the same host copy where a tensor is in both: in place); the work
  // returned completes when `up` holds the results on the device. Every tensor must be on one
  // device. `block` runs a blocking wait with the interpreter lock released.
  c10::intrusive_ptr<c10d::Work> stage(int rank, c10d::OpType type,
                                       const std::vector<at::Tensor>& down,
                                       const std::vector<at::Tensor>& up, const Run& run,
                                       const std::function<void(const std::function<void()>&)>& block) {
    const c10::Device device = common_device(down, up);
    c10::impl::VirtualGuardImpl impl(device.type());
    c10::DeviceGuard on_device(device);
    const c10::Stream side = side_after_caller(device, impl);
    std::vector<at::Tensor> host_down;
    if (!down.empty()) {
      {
        c10::StreamGuard on_side(side);
        for (const auto& tensor : down) {
          at::Tensor host = pinned_like(tensor);
          host.copy_(tensor, /*non_blocking=*/true);
          impl.recordDataPtrOnStream(tensor.storage().data_ptr(), side);
          host_down.push_back(std::move(host));
        }
      }
      c10::Event copied(device.type());
      copied.record(side);
      block([&copied] { copied.synchronize(); });  // the CPU core reads these bytes next
    }
    std::vector<at::Tensor> host_up;
    for (const auto& tensor : up) host_up.push_back(host_for(tensor, down, host_down));

    c10::intrusive_ptr<c10d::Work> inner = run(host_down, host_up);
    auto work = c10::make_intrusive<StagedWork>(rank, type, up, device, inner);
    inner->getFuture()->addCallback(
        [work, device, side, up, host_up](c10::ivalue::Future& done) {
          if (done.hasError()) return work->fail(done.exception_ptr());
          try {
            copy_back(device, side, up, host_up, [&work] { work->complete(); });
          } catch (...) {
            work->fail(std::current_exception());
          }
        });
    return work;
  }

  // A large allreduce in chunks, so that its stages overlap: every chunk's copy to the host
  // is queued at once, each chunk's CPU reduction is issued as soon as its bytes are on the
  // host (while the later ones are still copying down), and each chunk goes back up as soon as
  // it is reduced. Every rank cuts the same chunks (their sizes follow from the tensor's).
  // `reduce` issues one chunk's reduction (a host tensor, reduced in place).
  c10::intrusive_ptr<c10d::Work> allreduce_chunks(
      int rank, const at::Tensor& tensor, int64_t chunk_elements,
      const std::function<c10::intrusive_ptr<c10d::Work>(at::Tensor&)>& reduce,
      const std::function<void(const std::function<void()>&)>& block) {
    const c10::Device device = common_device({tensor}, {tensor});
    c10::impl::VirtualGuardImpl impl(device.type());
    c10::DeviceGuard on_device(device);
    const c10::Stream side = side_after_caller(device, impl);
    const at::Tensor flat = tensor.view({-1});
    const at::Tensor host = pinned_like(flat);
    const int64_t count = (flat.numel() + chunk_elements - 1) / chunk_elements;
    std::vector<c10::Event> copied;
    {
      c10::StreamGuard on_side(side);
      for (int64_t c = 0; c < count; ++c) {
        host.narrow(0, c * chunk_elements, chunk_length(flat, c, chunk_elements))
            .copy_(flat.narrow(0, c * chunk_elements, chunk_length(flat, c, chunk_elements)),
                   /*non_blocking=*/true);
        copied.emplace_back(device.type());
        copied.back().record(side);
      }
      impl.recordDataPtrOnStream(tensor.storage().data_ptr(), side);
    }
    std::vector<c10::intrusive_ptr<c10d::Work>> chunks;
    std::vector<at::Tensor> pieces;
    for (int64_t c = 0; c < count; ++c) {
      block([&copied, c] { copied[c].synchronize(); });
      pieces.push_back(host.narrow(0, c * chunk_elements, chunk_length(flat, c, chunk_elements)));
      chunks.push_back(reduce(pieces.back()));
    }
    auto work = c10::make_intrusive<StagedWork>(rank, c10d::OpType::ALLREDUCE,
                                                std::vector<at::Tensor>{tensor}, device,
                                                chunks.back());
    auto left = std::make_shared<std::atomic<int64_t>>(count);
    auto failed = std::make_shared<std::atomic<bool>>(false);
    for (int64_t c = 0; c < count; ++c) {
      at::Tensor target = flat.narrow(0, c * chunk_elements, chunk_length(flat, c, chunk_elements));
      chunks[c]->getFuture()->addCallback(
          [work, device, side, target, piece = pieces[c], left, failed](c10::ivalue::Future& done) {
            if (done.hasError()) {
              if (!failed->exchange(true)) work->fail(done.exception_ptr());
              return;
            }
            try {
              // the last chunk back completes the work, with every chunk's copy queued before it
              copy_back(device, side, {target}, {piece}, [&] {
                if (left->fetch_sub(1) == 1 && !failed->load()) work->complete();
              });
            } catch (...) {
              if (!failed->exchange(true)) work->fail(std::current_exception());
            }
          });
    }
    return work;
  }

 private:
  // The device's side stream, made to wait for what the caller's current stream queued before
  // this call: the inputs' values, and any use of the outputs that the copies back must come
  // after (a receive's target too).
  c10::Stream side_after_caller(c10::Device device, const c10::impl::VirtualGuardImpl& impl) {
    const c10::Stream side = side_stream(device, impl);
    c10::Event ready(device.type());
    ready.record(impl.getStream(device));
    ready.block(side);
    return side;
  }

  // Copies the host results into their device targets on the side stream, tells the caching
  // allocator the side stream used the targets, then runs `then` with the side stream still
  // current (a future completed there records its events on it).
  static void copy_back(c10::Device device, c10::Stream side, const std::vector<at::Tensor>& targets,
                        const std::vector<at::Tensor>& results, const std::function<void()>& then) {
    c10::DeviceGuard on_device(device);
    c10::StreamGuard on_side(side);
    c10::impl::VirtualGuardImpl impl(device.type());
    for (size_t i = 0; i < targets.size(); ++i) {
      at::Tensor target = targets[i];
      target.copy_(results[i], /*non_blocking=*/true);
      impl.recordDataPtrOnStream(target.storage().data_ptr(), side);
    }
    then();
  }

  static c10::Device common_device(const std::vector<at::Tensor>& down,
                                   const std::vector<at::Tensor>& up) {
    std::optional<c10::Device> device;
    for (const auto* list : {&down, &up}) {
      for (const auto& tensor : *list) {
        if (!device) device = tensor.device();
        TORCH_CHECK(tensor.device() == *device,
                    "shoal backend: the tensors of one call must be on one device (got ",
                    *device, " and ", tensor.device(), ")");
        TORCH_CHECK(!tensor.is_sparse(), "shoal backend: sparse tensors are not supported");
      }
    }
    TORCH_CHECK(device && !device->is_cpu(), "shoal backend: nothing to stage");
    return *device;
  }

  static int64_t chunk_length(const at::Tensor& flat, int64_t c, int64_t chunk_elements) {
    return std::min(chunk_elements, flat.numel() - c * chunk_elements);
  }

  static at::Tensor pinned_like(const at::Tensor& tensor) {
    return at::empty(tensor.sizes(), tensor.options().device(at::kCPU).pinned_memory(true));
  }

  // The host copy of `tensor` when it is also an input, else a new pinned tensor.
  static at::Tensor host_for(const at::Tensor& tensor, const std::vector<at::Tensor>& down,
                             const std::vector<at::Tensor>& host_down) {
    for (size_t i = 0; i < down.size(); ++i) {
      if (down[i].is_same(tensor)) return host_down[i];
    }
    return pinned_like(tensor);
  }

  c10::Stream side_stream(c10::Device device, const c10::impl::VirtualGuardImpl& impl) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = streams_.find(device.index());
    if (found == streams_.end()) {
      found = streams_.emplace(device.index(), impl.getStreamFromGlobalPool(device)).first;
    }
    return found->second;
  }

  std::mutex mutex_;
  std::map<c10::DeviceIndex, c10::Stream> streams_;
};

}  // namespace shoal_torch
