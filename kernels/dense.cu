// The dense layer's element work around its cuBLAS products
// (src/kernels/dense_cuda.rs; src/kernels/dense.rs is the reference): the
// bias rows the forward product adds onto, and the bias gradient, a sum
// over rows in two coalesced stages.
#include "common.cuh"

// y [rows, n] = b in every row: a thread per V columns (blockIdx.x,
// threadIdx.x; V = 1, or a 16-byte pack where the launcher found rows of
// whole packs and an aligned bias) and a row stride (blockIdx.y, gridDim.y),
// so no index division. The output is a fresh, aligned buffer.
template <typename T, int V> __device__ void bias_rows(const T* b, T* y, size_t rows, int n) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (c >= n) return;
  float v[V];
  load_f<T, V>(b + c, v);
  for (size_t r = blockIdx.y; r < rows; r += gridDim.y) store_f<T, V>(y + r * n + c, v);
}

// partial [chunks, cols]: column sums of g over `per` rows each. A block
// (32, 8) per chunk and tile of 32 V columns: a lane per V consecutive
// columns (V = 1, or a 16-byte pack where the launcher found rows of whole
// packs on an aligned buffer), its block's 8 rows of threads taking every
// 8th row of the chunk; their 8 sums are added in order. A pack a thread
// keeps 16 bytes in flight where a value a thread kept 2.
template <typename T, int V>
__device__ void column_sum_partial(const T* g, float* partial, int rows, int cols, int per) {
  __shared__ float s[8][32 * V + 1];
  const int c0 = (blockIdx.y * 32 + threadIdx.x) * V;
  const int r0 = blockIdx.x * per, r1 = min(rows, r0 + per);
  float acc[V];
  for (int j = 0; j < V; j++) acc[j] = 0.f;
  if (c0 < cols)
    for (int r = r0 + threadIdx.y; r < r1; r += 8) {
      float v[V];
      load_f<T, V>(g + (size_t)r * cols + c0, v);
      for (int j = 0; j < V; j++) acc[j] += v[j];
    }
  // A pack's V sums 32 apart, so that the lanes' stores fall on 32 banks.
  for (int j = 0; j < V; j++) s[threadIdx.y][j * 32 + threadIdx.x] = acc[j];
  __syncthreads();
  if (threadIdx.y == 0 && c0 < cols)
    for (int j = 0; j < V; j++) {
      float t = 0.f;
      for (int y = 0; y < 8; y++) t += s[y][j * 32 + threadIdx.x];
      partial[(size_t)blockIdx.x * cols + c0 + j] = t;
    }
}

// out [cols] = the partial sums added over chunks (sum_chunks).
template <typename T>
__device__ void column_sum_final(const float* partial, T* out, int chunks, int cols) {
  sum_chunks(partial, out, chunks, cols);
}

#define DENSE(T, S)                                                                         \
  extern "C" __global__ void bias_rows_##S(const T* b, T* y, size_t rows, int n) {          \
    bias_rows<T, 1>(b, y, rows, n);                                                         \
  }                                                                                         \
  extern "C" __global__ void bias_rows_packed_##S(const T* b, T* y, size_t rows, int n) {   \
    bias_rows<T, 16 / sizeof(T)>(b, y, rows, n);                                            \
  }                                                                                         \
  extern "C" __global__ void column_sum_partial_##S(const T* g, float* partial, int rows,    \
                                                    int cols, int per) {                    \
    column_sum_partial<T, 1>(g, partial, rows, cols, per);                                  \
  }                                                                                         \
  extern "C" __global__ void column_sum_partial_packed_##S(const T* g, float* partial,       \
                                                           int rows, int cols, int per) {   \
    column_sum_partial<T, 16 / sizeof(T)>(g, partial, rows, cols, per);                     \
  }                                                                                         \
  extern "C" __global__ void column_sum_final_##S(const float* partial, T* out, int chunks,  \
                                                  int cols) {                               \
    column_sum_final(partial, out, chunks, cols);                                           \
  }
FOR_FLOAT_TYPES(DENSE)
