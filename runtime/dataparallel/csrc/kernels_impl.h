// Kernel bodies, compiled twice by kernels.cpp: once for the x86-64-v2
// baseline and once for AVX2, chosen at run time. Included inside a namespace.

// fp16 <-> fp32 by bit manipulation (round to nearest even, as IEEE and F16C),
// written branch-free so that the compiler vectorises it.
static inline float f32_from_bits(uint32_t w) {
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}
static inline uint32_t f32_to_bits(float f) {
  uint32_t w;
  std::memcpy(&w, &f, 4);
  return w;
}
static inline float half_to_float(uint16_t h) {
  const uint32_t w = (uint32_t)h << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = f32_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t bits = two_w < (1u << 27) ? f32_to_bits(denormalized) : f32_to_bits(normalized);
  return f32_from_bits(sign | bits);
}
static inline uint16_t float_to_half(float f) {
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = f32_to_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = f32_to_bits(base);
  const uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
  return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}
static inline float bf16_to_float(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }
static inline uint16_t float_to_bf16(float f) {
  const uint32_t w = f32_to_bits(f);
  const uint32_t rounded = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
  const bool nan = (w & 0x7FFFFFFFu) > 0x7F800000u;
  return (uint16_t)(nan ? ((w >> 16) | 0x40u) : rounded);
}

struct Same {};
struct Half {};
struct BF16 {};

template <class T, class Acc, class Kind>
struct Codec;
template <class T>
struct Codec<T, T, Same> {
  static T load(T v) { return v; }
  static T store(T v) { return v; }
};
template <>
struct Codec<uint16_t, float, Half> {
  static float load(uint16_t v) { return half_to_float(v); }
  static uint16_t store(float v) { return float_to_half(v); }
};
template <>
struct Codec<uint16_t, float, BF16> {
  static float load(uint16_t v) { return bf16_to_float(v); }
  static uint16_t store(float v) { return float_to_bf16(v); }
};

// Integers wrap (computed unsigned: signed overflow is undefined in C++).
template <class A>
static inline A wrap_add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return (A)((U)a + (U)b);
  } else {
    return a + b;
  }
}
template <class A>
static inline A wrap_mul(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return (A)((U)a * (U)b);
  } else {
    return a * b;
  }
}

// out[i] (and copy[i] when COPY) = a[i] (op) b[i], in one pass.
template <class T, int OP, bool COPY>
static void pair(T* out, const T* a, const T* b, std::size_t n, T* copy) {
  for (std::size_t i = 0; i < n; ++i) {
    T v;
    if constexpr (OP == 0) v = wrap_add(a[i], b[i]);
    if constexpr (OP == 2) v = b[i] < a[i] ? b[i] : a[i];
    if constexpr (OP == 3) v = b[i] > a[i] ? b[i] : a[i];
    if constexpr (OP == 4) v = wrap_mul(a[i], b[i]);
    out[i] = v;
    if constexpr (COPY) copy[i] = v;
  }
}

// One pass per source over a block kept in cache; each pass is a simple loop
// the compiler vectorises. The op is a template parameter so the loops are branch-free.
template <class T, class A, class K, int OP>
static void reduce_block(T* out, const T* const* srcs, int nsrc, std::size_t n, int divisor,
                         T* copy) {
  using C = Codec<T, A, K>;
  // Two sources of a plain type (the common case: two local ranks, or two
  // hosts): one pass, no accumulator block.
  if constexpr (std::is_same_v<K, Same>) {
    if (nsrc == 2 && divisor <= 1) {
      if (copy != nullptr) return pair<T, OP, true>(out, srcs[0], srcs[1], n, copy);
      return pair<T, OP, false>(out, srcs[0], srcs[1], n, nullptr);
    }
  }
  constexpr std::size_t B = 2048;
  A acc[B];
  for (std::size_t base = 0; base < n; base += B) {
    const std::size_t m = n - base < B ? n - base : B;
    const T* s0 = srcs[0] + base;
    for (std::size_t i = 0; i < m; ++i) acc[i] = C::load(s0[i]);
    for (int s = 1; s < nsrc; ++s) {
      const T* src = srcs[s] + base;
      for (std::size_t i = 0; i < m; ++i) {
        const A v = C::load(src[i]);
        if constexpr (OP == 0) acc[i] = wrap_add(acc[i], v);
        if constexpr (OP == 2) acc[i] = v < acc[i] ? v : acc[i];
        if constexpr (OP == 3) acc[i] = v > acc[i] ? v : acc[i];
        if constexpr (OP == 4) acc[i] = wrap_mul(acc[i], v);
      }
    }
    T* o = out + base;
    if (divisor > 1) {
      const A d = (A)divisor;
      for (std::size_t i = 0; i < m; ++i) o[i] = C::store(acc[i] / d);
    } else {
      for (std::size_t i = 0; i < m; ++i) o[i] = C::store(acc[i]);
    }
    if (copy != nullptr) std::memcpy(copy + base, o, m * sizeof(T));  // o is in L1
  }
}

template <class T, class A, class K>
static void reduce_typed(ReduceOp op, void* out, const void* const* srcs, int nsrc,
                         std::size_t n, int divisor, void* copy_to) {
  T* o = static_cast<T*>(out);
  T* copy = static_cast<T*>(copy_to);
  const T* const* s = reinterpret_cast<const T* const*>(srcs);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Average:
      return reduce_block<T, A, K, 0>(o, s, nsrc, n, divisor, copy);
    case ReduceOp::Min:
      return reduce_block<T, A, K, 2>(o, s, nsrc, n, divisor, copy);
    case ReduceOp::Max:
      return reduce_block<T, A, K, 3>(o, s, nsrc, n, divisor, copy);
    case ReduceOp::Product:
      return reduce_block<T, A, K, 4>(o, s, nsrc, n, divisor, copy);
  }
}

static void reduce_dispatch(DType dtype, ReduceOp op, void* out, const void* const* srcs,
                            int nsrc, std::size_t n, int divisor, void* copy) {
  switch (dtype) {
    case DType::Float32:
      return reduce_typed<float, float, Same>(op, out, srcs, nsrc, n, divisor, copy);
    case DType::Float64:
      return reduce_typed<double, double, Same>(op, out, srcs, nsrc, n, divisor, copy);
    case DType::Float16:
      return reduce_typed<uint16_t, float, Half>(op, out, srcs, nsrc, n, divisor, copy);
    case DType::BFloat16:
      return reduce_typed<uint16_t, float, BF16>(op, out, srcs, nsrc, n, divisor, copy);
    case DType::Int32:
      return reduce_typed<int32_t, int32_t, Same>(op, out, srcs, nsrc, n, divisor, copy);
    case DType::Int64:
      return reduce_typed<int64_t, int64_t, Same>(op, out, srcs, nsrc, n, divisor, copy);
    case DType::UInt8:
      return reduce_typed<uint8_t, uint8_t, Same>(op, out, srcs, nsrc, n, divisor, copy);
  }
}
