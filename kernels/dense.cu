// The dense layer's element work around its cuBLAS products
// (src/kernels/dense_cuda.rs; src/kernels/dense.rs is the reference): the
// bias rows the forward product adds onto, and the bias gradient, a sum
// over rows in two coalesced stages.
#include "common.cuh"

// y [rows, n] = b in every row: a thread per column (blockIdx.x, threadIdx.x)
// and a row stride (blockIdx.y, gridDim.y), so no index division.
template <typename T> __device__ void bias_rows(const T* b, T* y, size_t rows, int n) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= n) return;
  const T v = b[c];
  for (size_t r = blockIdx.y; r < rows; r += gridDim.y) y[r * n + c] = v;
}

// partial [chunks, cols]: column sums of g over `per` rows each; a block is
// (chunk, tile of 256 columns), a thread per column.
template <typename T>
__device__ void column_sum_partial(const T* g, float* partial, int rows, int cols, int per) {
  const int col = blockIdx.y * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  const int r0 = blockIdx.x * per, r1 = min(rows, r0 + per);
  float s = 0.f;
  for (int r = r0; r < r1; r++) s += to_f(g[(size_t)r * cols + col]);
  partial[(size_t)blockIdx.x * cols + col] = s;
}

// out [cols] = the partial sums added over chunks (sum_chunks).
template <typename T>
__device__ void column_sum_final(const float* partial, T* out, int chunks, int cols) {
  sum_chunks(partial, out, chunks, cols);
}

#define DENSE(T, S)                                                                         \
  extern "C" __global__ void bias_rows_##S(const T* b, T* y, size_t rows, int n) {          \
    bias_rows(b, y, rows, n);                                                               \
  }                                                                                         \
  extern "C" __global__ void column_sum_partial_##S(const T* g, float* partial, int rows,    \
                                                    int cols, int per) {                    \
    column_sum_partial(g, partial, rows, cols, per);                                        \
  }                                                                                         \
  extern "C" __global__ void column_sum_final_##S(const float* partial, T* out, int chunks,  \
                                                  int cols) {                               \
    column_sum_final(partial, out, chunks, cols);                                           \
  }
FOR_FLOAT_TYPES(DENSE)
