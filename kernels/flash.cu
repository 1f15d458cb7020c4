// Tiled causal attention (FlashAttention-2's algorithm) on tensor cores,
// for f16 and bf16 with head widths 16, 32 and 64: no t x t tensor is ever
// in memory. The forward keeps a running max and sum per query row and
// writes the output and each row's log-sum-exp; the backward recomputes
// the weights from that log-sum-exp, tile by tile. src/kernels/flash.rs
// launches these; src/kernels/attention.rs has the algorithm's CPU
// reference, and tests/emulated_kernels.rs runs this file on the CPU.
//
// Layouts are the fused attention's: qkv [b, t, 3c] (q, k and v side by
// side, head h at columns h*HD of each), y and dy [b, t, c], lse and
// delta [b * heads, t] in f32. A block is 4 warps; each warp owns 16 rows
// of every tile, so most steps need only __syncwarp.
//
// The products go through WMMA fragments and shared memory only, with no
// assumption about which lane holds which element of a fragment (the
// element-wise steps read the tiles back from shared memory). The half
// tiles that fragments load in the inner loops have rows padded by 8
// values (16 bytes), so that the 8 rows one load reads fall in different
// banks rather than all in the same 4. Kept under 48 KiB of static shared
// memory for HD <= 64.
#include "common.cuh"
#include <mma.h>
#include <type_traits>

using namespace nvcuda;

#define WARPS 4
#define THREADS (WARPS * 32)

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;
template <typename T, typename L> using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, L>;
template <typename T, typename L> using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, L>;

// Copies rows [r0, r0 + rows) of one head (HD values at `src`, rows
// `stride` apart) into `dst` [rows][LD], zeros past row t: 16 bytes a load
// where the rows are 16-byte aligned (the fused qkv's always are unless a
// width is odd), one value a load otherwise.
template <typename T, int HD, int LD>
__device__ void load_tile(T* dst, const T* src, size_t stride, int r0, int rows, int t) {
  constexpr int V = 16 / sizeof(T);
  if (HD % V == 0 && (size_t)src % 16 == 0 && stride % V == 0) {
    for (int i = threadIdx.x; i < rows * HD / V; i += blockDim.x) {
      const int r = i / (HD / V), d = i % (HD / V) * V;
      const uint4 zero = {0, 0, 0, 0};
      *reinterpret_cast<uint4*>(dst + r * LD + d) =
          r0 + r < t ? *reinterpret_cast<const uint4*>(src + (size_t)(r0 + r) * stride + d) : zero;
    }
    return;
  }
  for (int i = threadIdx.x; i < rows * HD; i += blockDim.x) {
    const int r = i / HD, d = i % HD;
    dst[r * LD + d] = r0 + r < t ? src[(size_t)(r0 + r) * stride + d] : from_f<T>(0.f);
  }
}

// out[16 x N] = a . b^T for one warp, into f32 shared memory (row stride
// ldo): a is a row-major [16 x K] (lda), b a row-major [N x K] (ldb), read
// as a column-major [K x N]. N and K are multiples of 16.
template <typename T, int N, int K>
__device__ void warp_product_t(float* out, int ldo, const T* a, int lda, const T* b, int ldb) {
  for (int n = 0; n < N / 16; n++) {
    Acc acc;
    wmma::fill_fragment(acc, 0.f);
    for (int k = 0; k < K / 16; k++) {
      FragA<T, wmma::row_major> fa;
      FragB<T, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, a + k * 16, lda);
      wmma::load_matrix_sync(fb, b + n * 16 * ldb + k * 16, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, ldo, wmma::mem_row_major);
  }
}

// acc[n] += a . b[:, 16n..16n+16] for n < N / 16: a a row-major [16 x K]
// (lda), b a row-major [K x N] (ldb).
template <typename T, int N, int K>
__device__ void warp_accumulate(Acc* acc, const T* a, int lda, const T* b, int ldb) {
  for (int k = 0; k < K / 16; k++) {
    FragA<T, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a + k * 16, lda);
    for (int n = 0; n < N / 16; n++) {
      FragB<T, wmma::row_major> fb;
      wmma::load_matrix_sync(fb, b + k * 16 * ldb + n * 16, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Stores `scale * acc` (a warp's 16 rows of HD columns, staged through f32
// `stage` [rows][HD]) to `dst` rows r0.., `stride` apart, below row t.
template <typename T, int HD>
__device__ void store_rows(T* dst, size_t stride, Acc* acc, float scale, float* stage, int r0,
                           int rows, int t) {
  const int warp = threadIdx.x / 32;
  for (int n = 0; n < HD / 16; n++) {
    for (int i = 0; i < acc[n].num_elements; i++) acc[n].x[i] *= scale;
    wmma::store_matrix_sync(stage + warp * 16 * HD + n * 16, acc[n], HD, wmma::mem_row_major);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * HD; i += blockDim.x) {
    const int r = i / HD, d = i % HD;
    if (r0 + r < t) dst[(size_t)(r0 + r) * stride + d] = from_f<T>(stage[i]);
  }
}

// ---- forward: a block per (64 query rows, batch x head) ----------------

template <typename T, int HD>
__device__ void flash_forward(const T* qkv, T* y, float* lse, int t, int heads, float scale) {
  constexpr int BR = WARPS * 16, BC = 32, LD = HD + 8, LP = BC + 8;
  __shared__ __align__(32) T sq[BR * LD];
  __shared__ __align__(32) T sk[BC * LD];
  __shared__ __align__(32) T sv[BC * LD];
  __shared__ __align__(32) T sp[BR * LP];
  __shared__ __align__(32) float ss[BR * BC];
  __shared__ __align__(32) float so[BR * HD];
  __shared__ float sm[BR], sl[BR];

  const int warp = threadIdx.x / 32;
  const int bh = blockIdx.y, h = bh % heads;
  // The longest rows (the last blocks) first.
  const int r0 = (gridDim.x - 1 - blockIdx.x) * BR;
  const int c = heads * HD;
  const size_t stride = 3 * (size_t)c;
  const T* base = qkv + (size_t)(bh / heads) * t * stride + h * HD;

  load_tile<T, HD, LD>(sq, base, stride, r0, BR, t);
  for (int i = threadIdx.x; i < BR * HD; i += blockDim.x) so[i] = 0.f;
  for (int i = threadIdx.x; i < BR; i += blockDim.x) sm[i] = -INFINITY, sl[i] = 0.f;

  // Two threads per row for the softmax: row `me`, every other column.
  const int me = threadIdx.x / 2, half = threadIdx.x % 2;
  const int last = min(t, r0 + BR) - 1;
  for (int k0 = 0; k0 <= last; k0 += BC) {
    __syncthreads();  // everyone is done with the previous K and V
    load_tile<T, HD, LD>(sk, base + c, stride, k0, BC, t);
    load_tile<T, HD, LD>(sv, base + 2 * c, stride, k0, BC, t);
    __syncthreads();
    warp_product_t<T, BC, HD>(ss + warp * 16 * BC, BC, sq + warp * 16 * LD, LD, sk, LD);
    __syncwarp();
    // Key 0 is in the first tile and every row sees it, so the running max
    // is finite from then on.
    float* s = ss + me * BC;
    const int q = r0 + me;
    float mx = -INFINITY;
    for (int j = half; j < BC; j += 2) {
      const int k = k0 + j;
      const float v = k <= q && k < t ? s[j] * scale : -INFINITY;
      s[j] = v;
      mx = fmaxf(mx, v);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_old = sm[me], m_new = fmaxf(m_old, mx);
    const float alpha = expf(m_old - m_new);
    float sum = 0.f;
    for (int j = half; j < BC; j += 2) {
      const float p = expf(s[j] - m_new);
      sum += p;
      sp[me * LP + j] = from_f<T>(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    for (int d = half; d < HD; d += 2) so[me * HD + d] *= alpha;
    __syncwarp();
    if (half == 0) sm[me] = m_new, sl[me] = sl[me] * alpha + sum;
    // O += P V, through the accumulators held in shared memory.
    for (int n = 0; n < HD / 16; n++) {
      Acc acc;
      float* o = so + warp * 16 * HD + n * 16;
      wmma::load_matrix_sync(acc, o, HD, wmma::mem_row_major);
      for (int k = 0; k < BC / 16; k++) {
        FragA<T, wmma::row_major> fa;
        FragB<T, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, sp + warp * 16 * LP + k * 16, LP);
        wmma::load_matrix_sync(fb, sv + k * 16 * LD + n * 16, LD);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(o, acc, HD, wmma::mem_row_major);
    }
  }
  __syncthreads();
  T* out = y + (size_t)(bh / heads) * t * c + h * HD;
  for (int i = threadIdx.x; i < BR * HD; i += blockDim.x) {
    const int r = i / HD, d = i % HD;
    if (r0 + r < t) out[(size_t)(r0 + r) * c + d] = from_f<T>(so[i] / sl[r]);
  }
  for (int r = threadIdx.x; r < BR; r += blockDim.x)
    if (r0 + r < t) lse[(size_t)bh * t + r0 + r] = sm[r] + logf(sl[r]);
}

// ---- backward, part 1: dQ, and delta = rowsum(dY * Y) -------------------
// A block per (64 query rows, batch x head), over the key tiles up to its
// last row. Runs before part 2, which reads delta.

template <typename T, int HD>
__device__ void flash_backward_dq(const T* qkv, const T* y, const T* dy, const float* lse,
                                  float* delta, T* dqkv, int t, int heads, float scale) {
  constexpr int BR = WARPS * 16, BC = 32, LD = HD + 8;
  static_assert(BR * HD <= 2 * BR * BC, "dQ is staged in the score tiles");
  __shared__ __align__(32) T sq[BR * LD];
  __shared__ __align__(32) T sdo[BR * LD];
  __shared__ __align__(32) T sk[BC * LD];
  __shared__ __align__(32) T sv[BC * LD];
  __shared__ __align__(32) T sds[BR * BC];
  __shared__ __align__(32) float sf[2 * BR * BC];  // scores, then dP
  __shared__ float sl[BR], sd[BR];
  float* ss = sf;
  float* sdp = sf + BR * BC;

  const int warp = threadIdx.x / 32;
  const int bh = blockIdx.y, h = bh % heads;
  const int r0 = (gridDim.x - 1 - blockIdx.x) * BR;
  const int c = heads * HD;
  const size_t stride = 3 * (size_t)c;
  const size_t b0 = (size_t)(bh / heads) * t;
  const T* base = qkv + b0 * stride + h * HD;
  const T* dyb = dy + b0 * c + h * HD;
  const T* yb = y + b0 * c + h * HD;

  load_tile<T, HD, LD>(sq, base, stride, r0, BR, t);
  load_tile<T, HD, LD>(sdo, dyb, c, r0, BR, t);
  // Two threads per row again: row `me`, every other column.
  const int me = threadIdx.x / 2, half = threadIdx.x % 2;
  const int q = r0 + me;
  {
    float dot = 0.f;
    if (q < t)
      for (int d = half; d < HD; d += 2) dot += to_f(dyb[(size_t)q * c + d]) * to_f(yb[(size_t)q * c + d]);
    dot += __shfl_xor_sync(0xffffffffu, dot, 1);
    if (half == 0) {
      sd[me] = dot;
      sl[me] = q < t ? lse[(size_t)bh * t + q] : 0.f;
      if (q < t) delta[(size_t)bh * t + q] = dot;
    }
  }
  Acc acc[HD / 16];
  for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(acc[n], 0.f);

  const int last = min(t, r0 + BR) - 1;
  for (int k0 = 0; k0 <= last; k0 += BC) {
    __syncthreads();
    load_tile<T, HD, LD>(sk, base + c, stride, k0, BC, t);
    load_tile<T, HD, LD>(sv, base + 2 * c, stride, k0, BC, t);
    __syncthreads();
    warp_product_t<T, BC, HD>(ss + warp * 16 * BC, BC, sq + warp * 16 * LD, LD, sk, LD);
    warp_product_t<T, BC, HD>(sdp + warp * 16 * BC, BC, sdo + warp * 16 * LD, LD, sv, LD);
    __syncwarp();
    for (int j = half; j < BC; j += 2) {
      const int k = k0 + j, i = me * BC + j;
      const float p = k <= q && q < t ? expf(ss[i] * scale - sl[me]) : 0.f;
      sds[i] = from_f<T>(p * (sdp[i] - sd[me]));
    }
    __syncwarp();
    warp_accumulate<T, HD, BC>(acc, sds + warp * 16 * BC, BC, sk, LD);
  }
  __syncthreads();
  store_rows<T, HD>(dqkv + b0 * stride + h * HD, stride, acc, scale, sf, r0, BR, t);
}

// ---- backward, part 2: dK and dV ----------------------------------------
// A block per (64 keys, batch x head), over the query tiles from its first
// key on. Each warp owns 16 keys, and works on the transposed tiles
// (keys x queries), so everything but the Q and dY tiles is its own.

template <typename T, int HD>
__device__ void flash_backward_dkv(const T* qkv, const T* dy, const float* lse,
                                   const float* delta, T* dqkv, int t, int heads, float scale) {
  constexpr int BK = WARPS * 16, BQ = 32, LD = HD + 8;
  static_assert(BK * HD <= 2 * BK * BQ, "dK and dV are staged in the score tiles");
  __shared__ __align__(32) T sk[BK * LD];
  __shared__ __align__(32) T sv[BK * LD];
  __shared__ __align__(32) T sq[BQ * LD];
  __shared__ __align__(32) T sdo[BQ * LD];
  __shared__ __align__(32) T sp[BK * BQ];
  __shared__ __align__(32) float sf[2 * BK * BQ];  // S^T, then dP^T and dS^T
  __shared__ float sl[BQ], sd[BQ];
  float* st = sf;
  float* sdp = sf + BK * BQ;

  const int warp = threadIdx.x / 32;
  const int bh = blockIdx.y, h = bh % heads;
  const int k0 = blockIdx.x * BK;
  const int c = heads * HD;
  const size_t stride = 3 * (size_t)c;
  const size_t b0 = (size_t)(bh / heads) * t;
  const T* base = qkv + b0 * stride + h * HD;
  const T* dyb = dy + b0 * c + h * HD;

  load_tile<T, HD, LD>(sk, base + c, stride, k0, BK, t);
  load_tile<T, HD, LD>(sv, base + 2 * c, stride, k0, BK, t);
  Acc dk[HD / 16], dv[HD / 16];
  for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(dk[n], 0.f), wmma::fill_fragment(dv[n], 0.f);

  // Two threads per key row of the transposed tiles.
  const int me = threadIdx.x / 2, half = threadIdx.x % 2;
  const int k = k0 + me;
  for (int q0 = k0; q0 < t; q0 += BQ) {
    __syncthreads();
    load_tile<T, HD, LD>(sq, base, stride, q0, BQ, t);
    load_tile<T, HD, LD>(sdo, dyb, c, q0, BQ, t);
    for (int i = threadIdx.x; i < BQ; i += blockDim.x) {
      const bool in = q0 + i < t;
      sl[i] = in ? lse[(size_t)bh * t + q0 + i] : 0.f;
      sd[i] = in ? delta[(size_t)bh * t + q0 + i] : 0.f;
    }
    __syncthreads();
    const T* mk = sk + warp * 16 * LD;
    warp_product_t<T, BQ, HD>(st + warp * 16 * BQ, BQ, mk, LD, sq, LD);
    warp_product_t<T, BQ, HD>(sdp + warp * 16 * BQ, BQ, sv + warp * 16 * LD, LD, sdo, LD);
    __syncwarp();
    for (int j = half; j < BQ; j += 2) {
      const int q = q0 + j, i = me * BQ + j;
      const float p = k <= q && q < t ? expf(st[i] * scale - sl[j]) : 0.f;
      sp[i] = from_f<T>(p);
      sdp[i] = p * (sdp[i] - sd[j]);
    }
    __syncwarp();
    warp_accumulate<T, HD, BQ>(dv, sp + warp * 16 * BQ, BQ, sdo, LD);
    __syncwarp();
    for (int j = half; j < BQ; j += 2) sp[me * BQ + j] = from_f<T>(sdp[me * BQ + j]);
    __syncwarp();
    warp_accumulate<T, HD, BQ>(dk, sp + warp * 16 * BQ, BQ, sq, LD);
  }
  __syncthreads();
  T* out = dqkv + b0 * stride + h * HD;
  store_rows<T, HD>(out + 2 * c, stride, dv, 1.f, sf, k0, BK, t);
  __syncthreads();
  store_rows<T, HD>(out + c, stride, dk, scale, sf, k0, BK, t);
}

#define FLASH(T, S, HD)                                                                        \
  extern "C" __global__ void __launch_bounds__(THREADS)                                        \
      flash_forward_##S##_##HD(const T* qkv, T* y, float* lse, int t, int heads, float scale) { \
    flash_forward<T, HD>(qkv, y, lse, t, heads, scale);                                       \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(THREADS) flash_backward_dq_##S##_##HD(          \
      const T* qkv, const T* y, const T* dy, const float* lse, float* delta, T* dqkv, int t,   \
      int heads, float scale) {                                                                \
    flash_backward_dq<T, HD>(qkv, y, dy, lse, delta, dqkv, t, heads, scale);                  \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(THREADS) flash_backward_dkv_##S##_##HD(         \
      const T* qkv, const T* dy, const float* lse, const float* delta, T* dqkv, int t,         \
      int heads, float scale) {                                                                \
    flash_backward_dkv<T, HD>(qkv, dy, lse, delta, dqkv, t, heads, scale);                    \
  }
#define FLASH_WIDTHS(T, S) FLASH(T, S, 16) FLASH(T, S, 32) FLASH(T, S, 64)
FLASH_WIDTHS(__half, f16)
FLASH_WIDTHS(__nv_bfloat16, bf16)
