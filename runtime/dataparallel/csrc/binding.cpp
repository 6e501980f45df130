// pybind11 module shoal.dataparallel._core: the Python face of the core. It
// links libshoal_core, so Python and framework glue share one core state.
// Buffers are taken through the buffer protocol; the GIL is released while a
// collective runs or is waited for.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "kernels.h"
#include "shoal/core.h"

namespace py = pybind11;

namespace {

struct Span {
  void* ptr;
  std::size_t bytes;
};

Span writable(py::buffer& b, const char* what) {
  py::buffer_info info = b.request(true);
  if (info.ndim > 0) {
    py::ssize_t expect = info.itemsize;
    for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
      if (info.shape[d] > 1 && info.strides[d] != expect)
        throw shoal::Error(shoal::Error::Kind::Usage, std::string(what) + " must be C-contiguous");
      expect *= info.shape[d];
    }
  }
  return {info.ptr, (std::size_t)(info.size * info.itemsize)};
}

std::size_t count_of(const Span& s, shoal::DType dtype) {
  const std::size_t es = shoal::dtype_size(dtype);
  if (s.bytes % es != 0)
    throw shoal::Error(shoal::Error::Kind::Usage, "buffer size is not a multiple of the dtype size");
  return s.bytes / es;
}

// Keeps the buffers alive until the collective completed.
struct Handle {
  shoal::WorkPtr work;
  py::object keep;
  bool test() { return work->test(); }
  int source() { return work->source(); }
  bool cancel() {
    py::gil_scoped_release nogil;  // takes the transfers' lock, which a waiter may hold
    return work->cancel();
  }
  void wait() {
    {
      py::gil_scoped_release nogil;
      work->wait();
    }
    keep = py::none();
  }
};

py::dict topology_dict(const shoal::Topology& t) {
  py::dict d;
  d["rank"] = t.rank;
  d["global_rank"] = t.global_rank;
  d["size"] = t.size;
  d["local_rank"] = t.local_rank;
  d["local_size"] = t.local_size;
  d["host_index"] = t.host_index;
  d["num_hosts"] = t.num_hosts;
  d["host"] = t.host;
  return d;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "Shoal collective core (see shoal.dataparallel.core for the Python API)";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const shoal::Error& e) {
      py::module_ errors = py::module_::import("shoal.errors");
      const char* cls = "CollectiveError";
      switch (e.kind()) {
        case shoal::Error::Kind::Timeout: cls = "CollectiveTimeoutError"; break;
        case shoal::Error::Kind::PeerLost: cls = "PeerLostError"; break;
        case shoal::Error::Kind::Usage: cls = "ValidationError"; break;
        case shoal::Error::Kind::System: cls = "CollectiveError"; break;
        case shoal::Error::Kind::Cancelled: cls = "ReceiveCancelledError"; break;
      }
      py::object exc = errors.attr(cls)(e.what());
      py::list ranks;
      for (int r : e.ranks()) ranks.append(r);
      exc.attr("ranks") = ranks;
      PyErr_SetObject(py::type::handle_of(exc).ptr(), exc.ptr());
    }
  });

  py::class_<Handle>(m, "Handle")
      .def("test", &Handle::test)
      .def("wait", &Handle::wait)
      .def("source", &Handle::source)
      .def("cancel", &Handle::cancel);

  m.def("init", [] {
    const shoal::Topology* t;
    {
      py::gil_scoped_release nogil;
      t = &shoal::init();
    }
    return topology_dict(*t);
  });
  m.def("is_initialized", &shoal::is_initialized);
  m.def("shutdown", &shoal::shutdown, py::call_guard<py::gil_scoped_release>());
  m.def("dtype_size", [](int d) { return shoal::dtype_size(static_cast<shoal::DType>(d)); });

  // Every collective takes the communicator first: the world or a group.
  py::class_<shoal::Group, shoal::GroupPtr>(m, "Group")
      .def("topology", [](shoal::Group& g) { return topology_dict(g.topology()); })
      .def("destroy", &shoal::Group::destroy, py::call_guard<py::gil_scoped_release>());
  m.def("world", &shoal::world);
  m.def("new_group", [](shoal::GroupPtr parent, std::vector<int> ranks) {
    py::gil_scoped_release nogil;
    return shoal::new_group(parent, ranks);
  });

  m.def("allreduce", [](shoal::GroupPtr g, py::buffer buf, int dtype, int op) {
    Span s = writable(buf, "array");
    auto d = static_cast<shoal::DType>(dtype);
    std::size_t n = count_of(s, d);
    py::gil_scoped_release nogil;
    g->allreduce(s.ptr, n, d, static_cast<shoal::ReduceOp>(op));
  });
  m.def("allreduce_async", [](shoal::GroupPtr g, py::buffer buf, int dtype, int op) {
    Span s = writable(buf, "array");
    auto d = static_cast<shoal::DType>(dtype);
    std::size_t n = count_of(s, d);
    return Handle{g->allreduce_async(s.ptr, n, d, static_cast<shoal::ReduceOp>(op)), buf};
  });
  m.def("broadcast", [](shoal::GroupPtr g, py::buffer buf, int root) {
    Span s = writable(buf, "array");
    py::gil_scoped_release nogil;
    g->broadcast(s.ptr, s.bytes, root);
  });
  m.def("allgather", [](shoal::GroupPtr g, py::buffer send, py::buffer recv) {
    Span in = writable(send, "array");
    Span out = writable(recv, "output");
    const int size = g->topology().size;
    if (out.bytes != in.bytes * (std::size_t)size)
      throw shoal::Error(shoal::Error::Kind::Usage, "allgather output must hold size * input bytes");
    py::gil_scoped_release nogil;
    g->allgather(in.ptr, out.ptr, in.bytes);
  });
  m.def("reduce", [](shoal::GroupPtr g, py::buffer buf, int dtype, int op, int root) {
    Span s = writable(buf, "array");
    auto d = static_cast<shoal::DType>(dtype);
    std::size_t n = count_of(s, d);
    py::gil_scoped_release nogil;
    g->reduce(s.ptr, n, d, static_cast<shoal::ReduceOp>(op), root);
  });
  m.def("barrier", [](shoal::GroupPtr g) {
    py::gil_scoped_release nogil;
    g->barrier();
  });
  m.def("flush", [](shoal::GroupPtr g) { g->flush(); });
  m.def("reduce_scatter", [](shoal::GroupPtr g, py::buffer send, py::buffer recv, int dtype, int op) {
    Span in = writable(send, "array"), out = writable(recv, "output");
    auto d = static_cast<shoal::DType>(dtype);
    const std::size_t n = count_of(out, d);
    if (in.bytes != out.bytes * (std::size_t)g->topology().size)
      throw shoal::Error(shoal::Error::Kind::Usage, "reduce_scatter input must hold size * output bytes");
    py::gil_scoped_release nogil;
    g->reduce_scatter(in.ptr, out.ptr, n, d, static_cast<shoal::ReduceOp>(op));
  });
  m.def("alltoall", [](shoal::GroupPtr g, py::buffer send, std::vector<std::size_t> sc,
                       std::vector<std::size_t> so, py::buffer recv, std::vector<std::size_t> rc,
                       std::vector<std::size_t> ro) {
    Span in = writable(send, "array"), out = writable(recv, "output");
    for (std::size_t r = 0; r < sc.size() && r < so.size(); ++r)
      if (so[r] + sc[r] > in.bytes) throw shoal::Error(shoal::Error::Kind::Usage, "alltoall: a send block overruns the input");
    for (std::size_t r = 0; r < rc.size() && r < ro.size(); ++r)
      if (ro[r] + rc[r] > out.bytes) throw shoal::Error(shoal::Error::Kind::Usage, "alltoall: a receive block overruns the output");
    py::gil_scoped_release nogil;
    g->alltoall(in.ptr, sc, so, out.ptr, rc, ro);
  });
  m.def("gather", [](shoal::GroupPtr g, py::buffer send, py::buffer recv, int root) {
    Span in = writable(send, "array"), out = writable(recv, "output");
    if (g->topology().rank == root && out.bytes != in.bytes * (std::size_t)g->topology().size)
      throw shoal::Error(shoal::Error::Kind::Usage, "gather output must hold size * input bytes on the root");
    py::gil_scoped_release nogil;
    g->gather(in.ptr, out.ptr, in.bytes, root);
  });
  m.def("scatter", [](shoal::GroupPtr g, py::buffer send, py::buffer recv, int root) {
    Span in = writable(send, "array"), out = writable(recv, "output");
    if (g->topology().rank == root && in.bytes != out.bytes * (std::size_t)g->topology().size)
      throw shoal::Error(shoal::Error::Kind::Usage, "scatter input must hold size * output bytes on the root");
    py::gil_scoped_release nogil;
    g->scatter(in.ptr, out.ptr, out.bytes, root);
  });
  m.def("send_async", [](shoal::GroupPtr g, py::buffer buf, int peer, int tag) {
    Span s = writable(buf, "array");
    return Handle{g->send_async(s.ptr, s.bytes, peer, tag), buf};
  });
  m.def("recv_async", [](shoal::GroupPtr g, py::buffer buf, int peer, int tag) {
    Span s = writable(buf, "array");
    return Handle{g->recv_async(s.ptr, s.bytes, peer, tag), buf};
  });
  // The reduction kernel on local buffers, for testing its arithmetic.
  m.def("_reduce_local", [](py::buffer out, py::list sources, int dtype, int op, int divisor) {
    auto d = static_cast<shoal::DType>(dtype);
    Span o = writable(out, "output");
    std::vector<const void*> srcs;
    std::vector<py::buffer_info> keep;
    for (py::handle h : sources) {
      keep.push_back(py::reinterpret_borrow<py::buffer>(h).request());
      if ((std::size_t)(keep.back().size * keep.back().itemsize) != o.bytes)
        throw shoal::Error(shoal::Error::Kind::Usage, "sources must match the output size");
      srcs.push_back(keep.back().ptr);
    }
    if (srcs.empty()) throw shoal::Error(shoal::Error::Kind::Usage, "no sources");
    shoal::reduce_into(d, static_cast<shoal::ReduceOp>(op), o.ptr, srcs.data(), (int)srcs.size(),
                       count_of(o, d), divisor);
  });
}
