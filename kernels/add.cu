// a + b for two buffers of one length: the residual adds of a transformer
// block (src/kernels/add.rs). A thread takes 16 bytes of each at a time
// when every pointer is 16-byte aligned, then the tail a value at a time:
// candle's add, a value a thread, keeps too few bytes in flight to fill
// an H100's memory bandwidth (the residual adds were 3.0 ms of a 39 ms
// GPT-2 step in Nsight Compute).
#include "common.cuh"

template <typename T> __device__ void add(const T* a, const T* b, T* out, size_t n) {
  constexpr int V = 16 / sizeof(T);
  const size_t packs = aligned16(a, b, out) ? n / V : 0;
  FOR_EACH(p, packs) {
    uint4 x = reinterpret_cast<const uint4*>(a)[p], y = reinterpret_cast<const uint4*>(b)[p], z;
    const T* xv = reinterpret_cast<const T*>(&x);
    const T* yv = reinterpret_cast<const T*>(&y);
    T* zv = reinterpret_cast<T*>(&z);
    for (int j = 0; j < V; j++) zv[j] = from_f<T>(to_f(xv[j]) + to_f(yv[j]));
    reinterpret_cast<uint4*>(out)[p] = z;
  }
  FOR_EACH(i, n - packs * V) {
    const size_t k = packs * V + i;
    out[k] = from_f<T>(to_f(a[k]) + to_f(b[k]));
  }
}

#define ADD(T, S)                                                                    \
  extern "C" __global__ void add_##S(const T* a, const T* b, T* out, size_t n) { \
    add(a, b, out, n);                                                           \
  }
FOR_FLOAT_TYPES(ADD)
