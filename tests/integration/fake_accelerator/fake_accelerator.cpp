// A fake accelerator for tests on machines without one: torch's PrivateUse1 device type
// backed by host memory. One device; streams and events exist (ids, records, blocks) but
// everything runs at once, so copies are synchronous and every event is complete. Enough of
// ATen for tensors to be moved to it and back (empty, empty_strided, copies, views), every
// other operator run on the CPU (torch's CPU fallback), and pinned host memory served through
// its hooks, as a real accelerator's runtime does.
//
// Counters of what a caller asked of the device interfaces let tests check that
// device-generic code (the backend's host staging) recorded its events, made streams wait,
// and told the allocator which streams used which memory.

// Only what it uses (ATen, the operator registry, pybind11): torch/extension.h brings all of
// libtorch's C++ API, which took the build from 17 s to 24 s here.
#include <ATen/ATen.h>
#include <pybind11/pybind11.h>
#include <torch/library.h>

#include <ATen/EmptyTensor.h>
#include <ATen/InferSize.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

namespace py = pybind11;

namespace fake_accelerator {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

std::atomic<int64_t> events_recorded{0}, streams_blocked{0}, pointers_recorded{0},
    events_synchronized{0};

void release(void* ptr) { std::free(ptr); }

struct DeviceAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t bytes) override {
    void* ptr = bytes ? std::malloc(bytes) : nullptr;
    return {ptr, ptr, &release, c10::Device(kType, 0)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

// Host memory that says it is pinned, as an accelerator's host allocator would.
std::mutex pinned_mutex;
std::set<const void*> pinned;

void release_pinned(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    pinned.erase(ptr);
  }
  std::free(ptr);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t bytes) override {
    void* ptr = bytes ? std::malloc(bytes) : nullptr;
    std::lock_guard<std::mutex> lock(pinned_mutex);
    if (ptr) pinned.insert(ptr);
    return {ptr, ptr, &release_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

DeviceAllocator device_allocator;
PinnedAllocator pinned_allocator;

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  at::Device getDeviceFromPtr(void*) const override { return at::Device(kType, 0); }
  bool isPinnedPtr(const void* data) const override {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    return pinned.count(data) > 0;
  }
  at::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator; }
  void resizePrivateUse1Bytes(const c10::Storage&, size_t) const override {
    TORCH_CHECK(false, "fake accelerator: resizing storage is not supported");
  }
};

thread_local c10::StreamId current_stream = 0;
std::atomic<c10::StreamId> next_stream{1};

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device) const override { return c10::Device(kType, 0); }
  c10::Device getDevice() const override { return c10::Device(kType, 0); }
  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.index() <= 0, "fake accelerator: one device");
  }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, 0), current_stream);
  }
  c10::Stream getDefaultStream(c10::Device) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, 0), 0);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device, bool) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, 0), next_stream++);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    const c10::StreamId previous = current_stream;
    current_stream = stream.id();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, 0), previous);
  }
  void record(void** event, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    if (*event == nullptr) *event = new int(0);
    ++events_recorded;
  }
  void block(void* event, const c10::Stream&) const override {
    if (event != nullptr) ++streams_blocked;
  }
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<int*>(event);
  }
  void synchronizeEvent(void*) const override { ++events_synchronized; }
  void synchronizeStream(const c10::Stream&) const override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {
    ++pointers_recorded;
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

// ---- ATen kernels: allocation, copies, views ----------------------------------

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout>, std::optional<at::Device>,
                               std::optional<bool>, std::optional<at::MemoryFormat> format) {
  return at::detail::empty_generic(size, &device_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                         std::optional<at::Device>, std::optional<bool>) {
  return at::detail::empty_strided_generic(size, stride, &device_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

// A CPU tensor over the same bytes (the device's memory is host memory).
at::Tensor host_view(const at::Tensor& tensor) {
  if (tensor.device().is_cpu()) return tensor;
  return at::from_blob(tensor.data_ptr(), tensor.sizes(), tensor.strides(),
                       tensor.options().device(at::kCPU));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  host_view(dst).copy_(host_view(self));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  TORCH_CHECK(dst.sizes() == self.sizes(), "fake accelerator: no resizing copies");
  return copy_from(self, dst, false);
}

at::Tensor strided_view(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> offset) {
  auto result = at::detail::make_tensor<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(self.storage()), self.key_set(), self.dtype());
  result.unsafeGetTensorImpl()->set_sizes_and_strides(size, stride,
                                                     offset.value_or(self.storage_offset()));
  return result;
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  const std::vector<int64_t> inferred = at::infer_size(size, self.numel());
  TORCH_CHECK(self.is_contiguous(), "fake accelerator: view of a non-contiguous tensor");
  std::vector<int64_t> strides(inferred.size(), 1);
  for (int64_t i = static_cast<int64_t>(inferred.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * std::max<int64_t>(inferred[i + 1], 1);
  }
  return strided_view(self, inferred, strides, self.storage_offset());
}

// Every other operator runs on the CPU over the same bytes (torch's CPU fallback moves the
// arguments with the copies above): models train on the device.
void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  at::native::cpu_fallback(op, stack);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&run_on_cpu>());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("as_strided", strided_view);
  m.impl("view", view);
}

py::dict counters() {
  py::dict out;
  out["events_recorded"] = events_recorded.load();
  out["streams_blocked"] = streams_blocked.load();
  out["pointers_recorded"] = pointers_recorded.load();
  out["events_synchronized"] = events_synchronized.load();
  return out;
}

void register_hooks() {
  static Hooks* hooks = new Hooks();  // lives with the process, as torch expects
  at::RegisterPrivateUse1HooksInterface(hooks);
}

}  // namespace fake_accelerator

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("counters", &fake_accelerator::counters);
  m.def("register_hooks", &fake_accelerator::register_hooks);
}
