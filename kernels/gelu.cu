// GELU, tanh approximation, forward and backward (src/kernels/gelu.rs is
// the reference). A thread takes 16 bytes at a time (8 f16 or bf16 values,
// 4 f32) when every pointer is 16-byte aligned, then the tail a value at a
// time; a value at a time otherwise. The launcher sizes the grid for one
// pack per thread (`map1`, `map2` in src/kernels/cuda.rs).
#include "common.cuh"

#define K0 0.7978845608f  // sqrt(2 / pi)
#define K1 0.044715f

__device__ __forceinline__ float gelu_of(float v) {
  const float t = tanhf(K0 * (v + K1 * v * v * v));
  return 0.5f * v * (1.f + t);
}

// gelu'(v)
__device__ __forceinline__ float gelu_slope(float v) {
  const float v2 = v * v;
  const float t = tanhf(K0 * v * (1.f + K1 * v2));
  return 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * K0 * (1.f + 3.f * K1 * v2);
}

template <typename T> __device__ void gelu_fwd(const T* x, T* y, size_t n) {
  constexpr int V = 16 / sizeof(T);
  const size_t packs = aligned16(x, y) ? n / V : 0;
  FOR_EACH(p, packs) {
    uint4 a = reinterpret_cast<const uint4*>(x)[p], b;
    const T* av = reinterpret_cast<const T*>(&a);
    T* bv = reinterpret_cast<T*>(&b);
    for (int j = 0; j < V; j++) bv[j] = from_f<T>(gelu_of(to_f(av[j])));
    reinterpret_cast<uint4*>(y)[p] = b;
  }
  FOR_EACH(i, n - packs * V) {
    const size_t k = packs * V + i;
    y[k] = from_f<T>(gelu_of(to_f(x[k])));
  }
}

// out = grad * gelu'(x)
template <typename T> __device__ void gelu_bwd(const T* x, const T* g, T* out, size_t n) {
  constexpr int V = 16 / sizeof(T);
  const size_t packs = aligned16(x, g, out) ? n / V : 0;
  FOR_EACH(p, packs) {
    uint4 a = reinterpret_cast<const uint4*>(x)[p], b = reinterpret_cast<const uint4*>(g)[p], c;
    const T* av = reinterpret_cast<const T*>(&a);
    const T* bv = reinterpret_cast<const T*>(&b);
    T* cv = reinterpret_cast<T*>(&c);
    for (int j = 0; j < V; j++) cv[j] = from_f<T>(to_f(bv[j]) * gelu_slope(to_f(av[j])));
    reinterpret_cast<uint4*>(out)[p] = c;
  }
  FOR_EACH(i, n - packs * V) {
    const size_t k = packs * V + i;
    out[k] = from_f<T>(to_f(g[k]) * gelu_slope(to_f(x[k])));
  }
}

#define GELU(T, S)                                                                    \
  extern "C" __global__ void gelu_fwd_##S(const T* x, T* y, size_t n) { gelu_fwd(x, y, n); } \
  extern "C" __global__ void gelu_bwd_##S(const T* x, const T* g, T* out, size_t n) {        \
    gelu_bwd(x, g, out, n);                                                           \
  }
FOR_FLOAT_TYPES(GELU)
