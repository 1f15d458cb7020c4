// Shared by taper's kernels: dtype conversions and block reductions.
// Every kernel computes in f32 whatever the storage dtype, as the CPU
// references in src/kernels/ do.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// Unrolls the next loop fully, so that the register arrays it indexes stay
// in registers (nvcc otherwise may leave a nest of them unrolled in part,
// and the arrays in local memory). The emulation's g++ ignores it.
#if defined(__CUDACC__)
#define UNROLL _Pragma("unroll")
#define NO_UNROLL _Pragma("unroll 1")
#else
#define UNROLL
#define NO_UNROLL
#endif

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The sum over the block, returned to every thread. blockDim.x must be a
// multiple of 32 (launchers round it up). The leading barrier lets a kernel
// call this several times: the previous call's readers are done with `s`.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float s[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) s[warp] = v;
  __syncthreads();
  return warp_sum(lane < warps ? s[lane] : 0.f);
}

__device__ __forceinline__ float block_max(float v) {
  __shared__ float s[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) s[warp] = v;
  __syncthreads();
  return warp_max(lane < warps ? s[lane] : -INFINITY);
}

// Row kernels: a row per warp (block (32, 8), eight rows a block) when rows
// are short, a row per block (block (n, 1)) when they are long; the
// launcher (`row_groups` in src/kernels/cuda.rs) picks. threadIdx.x and
// blockDim.x index within the row either way; ROW declares the row and
// returns past the last one (a whole warp or block at once, so the
// reductions below stay collective).
#define ROW(row, rows)                                                          \
  const size_t row = (size_t)blockIdx.x * blockDim.y + threadIdx.y;             \
  if (row >= (size_t)(rows)) return;

// The sum and max over the row's threads, returned to each of them.
__device__ __forceinline__ float row_sum(float v) {
  return blockDim.x == 32 ? warp_sum(v) : block_sum(v);
}
__device__ __forceinline__ float row_max(float v) {
  return blockDim.x == 32 ? warp_max(v) : block_max(v);
}

// Whether every pointer given is 16-byte aligned, so that a thread may read
// and write 16 bytes (a uint4) at a time there.
template <typename... P> __device__ __forceinline__ bool aligned16(const P*... p) {
  return ((((uintptr_t)p) | ...) & 15) == 0;
}

// Values V at a time: with V > 1 (16 bytes: 8 f16 or bf16 values, 4 f32),
// a thread reads and writes a pack of V consecutive values with one
// access; callers take that path only when rows are a whole number of
// packs and every pointer is 16-byte aligned (aligned16 above).
template <typename T, int V> __device__ __forceinline__ void load_f(const T* p, float* out) {
  if constexpr (V == 1) {
    out[0] = to_f(*p);
  } else {
    static_assert(V * sizeof(T) == 16, "a pack is 16 bytes");
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* t = reinterpret_cast<const T*>(&raw);
    for (int j = 0; j < V; j++) out[j] = to_f(t[j]);
  }
}
template <typename T, int V> __device__ __forceinline__ void store_f(T* p, const float* in) {
  if constexpr (V == 1) {
    *p = from_f<T>(in[0]);
  } else {
    uint4 raw;
    T* t = reinterpret_cast<T*>(&raw);
    for (int j = 0; j < V; j++) t[j] = from_f<T>(in[j]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
}

// Grid-stride loop over n elements.
#define FOR_EACH(i, n)                                                          \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);       \
       i += (size_t)blockDim.x * gridDim.x)

// out[i] = f(x[i]) or f(x[i], y[i]) (computed in f32) for i < n, over a
// grid-stride loop: 16 bytes of each buffer a thread at a time when all are
// 16-byte aligned (the launcher sizes the grid for 8 values a thread), then
// the tail a value at a time; a value at a time otherwise. With Y false, y
// is not read.
template <bool Y, typename T, typename F>
__device__ __forceinline__ void map_impl(const T* x, const T* y, T* out, size_t n, F f) {
  constexpr int V = 16 / sizeof(T);
  const size_t packs = aligned16(x, Y ? y : x, out) ? n / V : 0;
  FOR_EACH(p, packs) {
    float a[V], b[V], c[V];
    load_f<T, V>(x + p * V, a);
    if constexpr (Y) load_f<T, V>(y + p * V, b);
    for (int j = 0; j < V; j++) {
      if constexpr (Y)
        c[j] = f(a[j], b[j]);
      else
        c[j] = f(a[j]);
    }
    store_f<T, V>(out + p * V, c);
  }
  FOR_EACH(i, n - packs * V) {
    const size_t k = packs * V + i;
    if constexpr (Y)
      out[k] = from_f<T>(f(to_f(x[k]), to_f(y[k])));
    else
      out[k] = from_f<T>(f(to_f(x[k])));
  }
}
template <typename T, typename F>
__device__ __forceinline__ void map_values(const T* x, T* out, size_t n, F f) {
  map_impl<false>(x, x, out, n, f);
}
template <typename T, typename F>
__device__ __forceinline__ void map_values(const T* x, const T* y, T* out, size_t n, F f) {
  map_impl<true>(x, y, out, n, f);
}

// extern "C" entry points for f32, f16 and bf16 (suffixes f32, f16, bf16).
#define FOR_FLOAT_TYPES(M) M(float, f32) M(__half, f16) M(__nv_bfloat16, bf16)

// The second stage of a column sum: out[k] = the sum over c < chunks of
// partial[c * m + k], for k < m. A block (32, 16) per 32 values of k: a
// thread per k (threadIdx.x) and per every 16th chunk (threadIdx.y), whose
// 16 sums are then added in order. A thread per k alone, walking all the
// chunks, left the GPU idle waiting on one load after another (a few
// dozen threads for a bias of 768). The order of additions is fixed, so
// the result repeats bit for bit.
#define SUM_CHUNKS_Y 16
template <typename T>
__device__ void sum_chunks(const float* partial, T* out, int chunks, int m) {
  __shared__ float s[SUM_CHUNKS_Y][33];
  const int k = blockIdx.x * 32 + threadIdx.x;
  float v = 0.f;
  if (k < m)
    for (int c = threadIdx.y; c < chunks; c += SUM_CHUNKS_Y) v += partial[(size_t)c * m + k];
  s[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y == 0 && k < m) {
    float t = 0.f;
    for (int y = 0; y < SUM_CHUNKS_Y; y++) t += s[y][threadIdx.x];
    out[k] = from_f<T>(t);
  }
}
