// Cross-entropy over rows of logits, one block per row (the pieces of the
// chunked cross-entropy; src/kernels/chunked_ce.rs is the reference). With
// label smoothing eps, a row's loss is lse - (1 - eps) z_y - eps mean(z).
// Rows are `cols` apart and their first `live` values are the vocabulary;
// the rest are padding (ignored by the loss, given a zero gradient).
//
// A thread reads V values at a time: a 16-byte pack (8 f16 or bf16, 4 f32)
// where rows are a whole number of packs and start on 16-byte boundaries,
// one value otherwise (`packs` below picks, for the whole block). A row is
// read in one pass for its lse (each thread keeps its max and its sum of
// exponentials together, rescaling the sum when the max grows), and once
// more where the gradient is written. With a value a thread, GPT-2's 8192
// rows of 50304 logits (824 MB in bf16) kept too few bytes in flight to
// come near the card's bandwidth.
#include "common.cuh"

// Folds n values into a running max m and sum s of exp(v - m). -inf
// values add nothing; a NaN makes the sum NaN.
template <int N> __device__ __forceinline__ void online_add(float& m, float& s, const float* v) {
  float top = m;
  for (int j = 0; j < N; j++) top = fmaxf(top, v[j]);
  if (top == -INFINITY) {
    for (int j = 0; j < N; j++)
      if (v[j] != v[j]) s = NAN;
    return;
  }
  if (top != m) s *= expf(m - top);
  for (int j = 0; j < N; j++) s += expf(v[j] - top);
  m = top;
}

// The row's lse (x) and the sum of its live values (y), for every thread
// of the block. Reads only the first `live` values, V at a time (a last
// pack that runs past `live` is read whole: rows are whole packs).
template <typename T, int V> __device__ float2 lse_total(const T* zr, int live) {
  float m = -INFINITY, s = 0.f, t = 0.f;
  const int packs = (live + V - 1) / V;
  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
    float v[V];
    load_f<T, V>(zr + (size_t)p * V, v);
    for (int j = 0; j < V; j++) {
      if (p * V + j < live)
        t += v[j];
      else
        v[j] = -INFINITY;
    }
    online_add<V>(m, s, v);
  }
  const float top = block_max(m);
  // A thread whose max is below the row's scales its sum down (m == top
  // also keeps a NaN sum of a thread that saw only NaN and -inf).
  const float lse = top + logf(block_sum(m == top ? s : s * expf(m - top)));
  return make_float2(lse, block_sum(t));
}

// z becomes dz = (softmax(z) - eps / V - (1 - eps) onehot(y)) * k, in place,
// V values at a time; padding past `live` becomes 0. `bad` (NaN for a
// target outside the vocabulary, else 0) is added to every live value. In
// place is safe: every read for the lse is behind the barriers of its
// reductions, and this loop reads and writes each value in one thread.
template <typename T, int V>
__device__ void write_grad(T* zr, int cols, int live, uint32_t target, float lse, float k,
                           float eps, float bad) {
  const float spread = eps / live;
  for (int p = threadIdx.x; p < cols / V; p += blockDim.x) {
    float v[V];
    if (p * V < live) load_f<T, V>(zr + (size_t)p * V, v);
    for (int j = 0; j < V; j++) {
      const int i = p * V + j;
      float d = 0.f;
      if (i < live) {
        d = (expf(v[j] - lse) - spread) * k + bad;
        if ((uint32_t)i == target) d -= (1.f - eps) * k;
      }
      v[j] = d;
    }
    store_f<T, V>(zr + (size_t)p * V, v);
  }
}

// The pack width for rows of `cols` values from `z`: 16 bytes where every
// row is whole packs and starts on a 16-byte boundary, else 1.
template <typename T> __device__ __forceinline__ bool packs(const T* z, int cols) {
  return cols % (16 / sizeof(T)) == 0 && aligned16(z);
}
#define BY_PACK(T, z, cols, f, ...)                                                           \
  do {                                                                                       \
    if (packs(z, cols))                                                                      \
      f<T, 16 / sizeof(T)>(__VA_ARGS__);                                                      \
    else                                                                                     \
      f<T, 1>(__VA_ARGS__);                                                                   \
  } while (0)

// Each row's loss.
template <typename T, int V>
__device__ void ce_loss_v(const T* z, const uint32_t* y, float* loss, int cols, int live,
                          float eps) {
  const T* zr = z + (size_t)blockIdx.x * cols;
  const float2 ls = lse_total<T, V>(zr, live);
  const uint32_t target = y[blockIdx.x];
  // A target outside the vocabulary gives NaN (checking on the host would
  // cost a device sync per step).
  if (threadIdx.x == 0)
    loss[blockIdx.x] = target < (uint32_t)live
                           ? ls.x - (1.f - eps) * to_f(zr[target]) - eps * (ls.y / live)
                           : NAN;
}

// The logits' gradient in place, for the loss's incoming gradient g (on
// the device: no host sync) times scale.
template <typename T, int V>
__device__ void ce_grad_v(T* z, const uint32_t* y, const float* g, int cols, int live,
                          float scale, float eps) {
  T* zr = z + (size_t)blockIdx.x * cols;
  const float lse = lse_total<T, V>(zr, live).x;
  const uint32_t target = y[blockIdx.x];
  const float bad = target < (uint32_t)live ? 0.f : NAN;
  write_grad<T, V>(zr, cols, live, target, lse, g[0] * scale, eps, bad);
}

// ce_loss and ce_grad in one kernel, for an incoming gradient of 1: the
// chunked cross-entropy's forward makes the gradient while the logits are
// at hand (its backward then multiplies by the real incoming gradient,
// scale_by below), so the logits are neither read again nor recomputed.
template <typename T, int V>
__device__ void ce_loss_grad_v(T* z, const uint32_t* y, float* loss, int cols, int live,
                               float scale, float eps) {
  T* zr = z + (size_t)blockIdx.x * cols;
  const uint32_t target = y[blockIdx.x];
  const bool ok = target < (uint32_t)live;
  // Read before any thread writes (the reductions' barriers come between).
  const float zy = ok ? to_f(zr[target]) : 0.f;
  const float2 ls = lse_total<T, V>(zr, live);
  if (threadIdx.x == 0)
    loss[blockIdx.x] = ok ? ls.x - (1.f - eps) * zy - eps * (ls.y / live) : NAN;
  write_grad<T, V>(zr, cols, live, target, ls.x, scale, eps, ok ? 0.f : NAN);
}

// y = x * s[0] in f32, where s is the loss's incoming gradient on the
// device: the chunked cross-entropy's backward, over the gradients its
// forward made for an incoming gradient of 1.
template <typename T> __device__ void scale_by(const T* x, const float* s, T* y, size_t n) {
  const float k = s[0];
  map_values(x, y, n, [k](float v) { return v * k; });
}

#define CE(T, S)                                                                             \
  extern "C" __global__ void ce_loss_##S(const T* z, const uint32_t* y, float* loss, int cols, \
                                         int live, float eps) {                              \
    BY_PACK(T, z, cols, ce_loss_v, z, y, loss, cols, live, eps);                             \
  }                                                                                          \
  extern "C" __global__ void ce_grad_##S(T* z, const uint32_t* y, const float* g, int cols,    \
                                         int live, float scale, float eps) {                 \
    BY_PACK(T, z, cols, ce_grad_v, z, y, g, cols, live, scale, eps);                         \
  }                                                                                          \
  extern "C" __global__ void ce_loss_grad_##S(T* z, const uint32_t* y, float* loss, int cols,  \
                                              int live, float scale, float eps) {             \
    BY_PACK(T, z, cols, ce_loss_grad_v, z, y, loss, cols, live, scale, eps);                 \
  }                                                                                          \
  extern "C" __global__ void scale_by_##S(const T* x, const float* s, T* y, size_t n) {        \
    scale_by(x, s, y, n);                                                                    \
  }
FOR_FLOAT_TYPES(CE)
