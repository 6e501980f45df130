// Slicing of a buffer among ranks or hosts (shared by the allreduce paths).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace shoal {

// Slice boundaries: equal parts, rounded to whole cache lines.
struct Range {
  std::size_t lo, hi;
  std::size_t size() const { return hi - lo; }
};

inline Range part(std::size_t n, int parts, int index, std::size_t esize) {
  const std::size_t align = std::max<std::size_t>(1, 64 / esize);
  std::size_t per = (n + parts - 1) / parts;
  per = (per + align - 1) / align * align;
  return {std::min(n, per * index), std::min(n, per * (index + 1))};
}

}  // namespace shoal
