// a + b for two buffers of one length: the residual adds of a transformer
// block (src/kernels/add.rs). A thread takes 16 bytes of each at a time
// where the buffers allow (map_values in common.cuh): candle's add, a
// value a thread, keeps too few bytes in flight to fill an H100's memory
// bandwidth (the residual adds were 3.0 ms of a 39 ms GPT-2 step in Nsight
// Compute).
#include "common.cuh"

template <typename T> __device__ void add(const T* a, const T* b, T* out, size_t n) {
  map_values(a, b, out, n, [](float x, float y) { return x + y; });
}

#define ADD(T, S)                                                                    \
  extern "C" __global__ void add_##S(const T* a, const T* b, T* out, size_t n) { \
    add(a, b, out, n);                                                           \
  }
FOR_FLOAT_TYPES(ADD)
