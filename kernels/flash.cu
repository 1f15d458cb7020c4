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
// (queries, or keys in dK/dV) and keeps their tiles in registers, as
// kernels/mma.cuh lays them out. Shared memory holds only the bf16/f16
// tiles of the inputs, 64 rows at a time, rows padded by 8 values (16
// bytes) so that the 8 rows an ldmatrix reads fall in different banks.
// The products' B operands come from there by ldmatrix (rows_b, and
// transposed in accumulate), a load per two products: loaded 32 or 16 bits
// at a time, they took 4 to 8 times the shared-memory instructions.
//
// The loop tiles (K and V in the forward and dQ, Q and dY in dK/dV) are
// double-buffered: the next tile's copies are queued with cp.async
// (kernels/cp_async.cuh) before the products on the current one, which
// used to wait for each tile's loads between two barriers. The tiles read
// once at the start (Q and dY in dQ, K and V in dK/dV) lie in the second
// buffer until they are in registers.
#include "common.cuh"
#include "cp_async.cuh"
#include "mma.cuh"

#define WARPS 4
#define THREADS (WARPS * 32)

// Copies rows [r0, r0 + rows) of one head (HD values at `src`, rows
// `stride` apart) into `dst` [rows][LD], zeros past row t: 16-byte copies
// queued by cp.async where the rows are 16-byte aligned (the fused qkv's
// always are unless a width is odd), which the caller commits and waits
// for; one value a load, done at once, otherwise.
template <typename T, int HD, int LD>
__device__ void load_tile(T* dst, const T* src, size_t stride, int r0, int rows, int t) {
  constexpr int V = 16 / sizeof(T);
  if (HD % V == 0 && (size_t)src % 16 == 0 && stride % V == 0) {
    for (int i = threadIdx.x; i < rows * HD / V; i += blockDim.x) {
      const int r = i / (HD / V), d = i % (HD / V) * V;
      const bool in = r0 + r < t;
      cp_async16(dst + r * LD + d, in ? src + (size_t)(r0 + r) * stride + d : src, in);
    }
    return;
  }
  for (int i = threadIdx.x; i < rows * HD; i += blockDim.x) {
    const int r = i / HD, d = i % HD;
    dst[r * LD + d] = r0 + r < t ? src[(size_t)(r0 + r) * stride + d] : from_f<T>(0.f);
  }
}

// A warp's A operands for its 16 rows of a [rows][LD] tile in shared
// memory, HD / 16 of them (16 columns each). `m` points at row g, column
// 2t of the warp's rows.
template <typename T, int KD, int LD>
__device__ __forceinline__ void load_rows(uint32_t (&a)[KD][4], const T* m) {
  for (int kk = 0; kk < KD; kk++) {
    a[kk][0] = load2(m + 16 * kk);
    a[kk][1] = load2(m + 8 * LD + 16 * kk);
    a[kk][2] = load2(m + 16 * kk + 8);
    a[kk][3] = load2(m + 8 * LD + 16 * kk + 8);
  }
}

// The B operands of a product against the 8 rows of `tile` from row r, as
// S = Q K^T takes K: b[kk] holds, for lane (g, t), row r + g's columns
// 16 kk + 2t and 2t + 1 (b[kk][0]) and 8 further (b[kk][1]), for every
// 16-column step kk. By ldmatrix: lane l points at row r + l % 8, columns
// from 8 (l / 8), and one load takes two steps.
template <typename T, int KD, int LD>
__device__ __forceinline__ void rows_b(uint32_t (&b)[KD][2], const T* tile, int r) {
  const int lane = threadIdx.x % 32;
  const T* p = tile + (r + lane % 8) * LD + 8 * (lane / 8);
  for (int kk = 0; kk + 1 < KD; kk += 2) {
    uint32_t x[4];
    ldsm_x4<false>(x, p + 16 * kk);
    b[kk][0] = x[0], b[kk][1] = x[1], b[kk + 1][0] = x[2], b[kk + 1][1] = x[3];
  }
  if constexpr (KD % 2 == 1) {
    uint32_t x[2];
    ldsm_x2(x, tile + (r + lane % 8) * LD + 8 * (lane / 8 % 2) + 16 * (KD - 1));
    b[KD - 1][0] = x[0], b[KD - 1][1] = x[1];
  }
}

// s[half] = a . rows^T for the 16 rows (two 8-row halves) of `tile` from
// row r: a product over HD, as S = Q K^T.
template <typename T, int KD, int LD>
__device__ __forceinline__ void product_t(float (&s)[2][4], const uint32_t (&a)[KD][4], const T* tile,
                                          int r) {
  for (int half = 0; half < 2; half++) {
    for (int i = 0; i < 4; i++) s[half][i] = 0.f;
    uint32_t b[KD][2];
    rows_b<T, KD, LD>(b, tile, r + 8 * half);
    for (int kk = 0; kk < KD; kk++) mma16816<T>(s[half], a[kk], b[kk]);
  }
}

// acc[n] += pa . tile[r..r+16][8n..8n+8] for every n: pa the packed A
// operand of 16 columns, against 16 rows of `tile`, as O += P V. The B
// operands (rows r + 2t, r + 2t + 1 and 8 further, column 8n + g) come
// transposed by ldmatrix, two n at a load: lane l points at row
// r + 8 (i % 2) + l % 8, columns from 8 (n + i / 2), for i = l / 8.
template <typename T, int ND, int LD>
__device__ __forceinline__ void accumulate(float (&acc)[ND][4], const uint32_t (&pa)[4], const T* tile,
                                           int r) {
  static_assert(ND % 2 == 0, "two 8-column slices a load");
  const int lane = threadIdx.x % 32, i = lane / 8;
  const T* p = tile + (r + 8 * (i % 2) + lane % 8) * LD + 8 * (i / 2);
  for (int n = 0; n < ND; n += 2) {
    uint32_t x[4];
    ldsm_x4<true>(x, p + 8 * n);
    const uint32_t b0[2] = {x[0], x[1]}, b1[2] = {x[2], x[3]};
    mma16816<T>(acc[n], pa, b0);
    mma16816<T>(acc[n + 1], pa, b1);
  }
}

template <typename T> __device__ __forceinline__ void pack_rows(uint32_t (&pa)[4], const float (&x)[2][4]) {
  pa[0] = pack2<T>(x[0][0], x[0][1]);
  pa[1] = pack2<T>(x[0][2], x[0][3]);
  pa[2] = pack2<T>(x[1][0], x[1][1]);
  pa[3] = pack2<T>(x[1][2], x[1][3]);
}

// Stores `scale * acc` (a warp's rows r and r + 8 for its lane) to rows
// `stride` apart, below row t.
template <typename T, int ND>
__device__ __forceinline__ void store_acc(T* dst, size_t stride, const float (&acc)[ND][4], float scale,
                                          int row, int t) {
  const int tq = threadIdx.x % 4;
  for (int r = 0; r < 2; r++) {
    const int q = row + 8 * r;
    if (q >= t) continue;
    for (int n = 0; n < ND; n++)
      for (int i = 0; i < 2; i++) dst[(size_t)q * stride + 8 * n + 2 * tq + i] = from_f<T>(scale * acc[n][2 * r + i]);
  }
}

// ---- forward: a block per (64 query rows, batch x head) ----------------
// Each warp keeps its 16 query rows' scores, weights and output in
// registers (kernels/mma.cuh's layout): lane (g, t) holds rows g and g + 8
// of every 8-column slice, columns 2t and 2t + 1. A row's max and sum are
// reduced over the 4 lanes that share it. Scores are kept in base 2
// (scaled by log2(e)) for exp2.

template <typename T, int HD>
__device__ void flash_forward(const T* qkv, T* y, float* lse, int t, int heads, float scale) {
  constexpr int BR = WARPS * 16, BC = 64, LD = HD + 8;
  constexpr int KD = HD / 16, NC = BC / 8, ND = HD / 8;
  __shared__ __align__(16) T sq[BR * LD];
  __shared__ __align__(16) T skv[2][2][BC * LD];  // [buffer][K, V]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int bh = blockIdx.y, h = bh % heads;
  // The longest rows (the last blocks) first.
  const int r0 = (gridDim.x - 1 - blockIdx.x) * BR;
  const int c = heads * HD;
  const size_t stride = 3 * (size_t)c;
  const T* base = qkv + (size_t)(bh / heads) * t * stride + h * HD;
  const float scale2 = scale * 1.4426950408889634f;  // log2(e)
  const auto fetch = [&](int k0, int buf) {
    load_tile<T, HD, LD>(skv[buf][0], base + c, stride, k0, BC, t);
    load_tile<T, HD, LD>(skv[buf][1], base + 2 * c, stride, k0, BC, t);
  };

  load_tile<T, HD, LD>(sq, base, stride, r0, BR, t);
  cp_async_commit();
  fetch(0, 0);
  cp_async_commit();
  cp_async_wait<1>();  // the Q tile
  __syncthreads();
  uint32_t qa[KD][4];
  load_rows<T, KD, LD>(qa, sq + (warp * 16 + g) * LD + 2 * tq);
  float o[ND][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int q[2] = {r0 + warp * 16 + g, r0 + warp * 16 + g + 8};

  const int last = min(t, r0 + BR) - 1;
  for (int k0 = 0, buf = 0; k0 <= last; k0 += BC, buf ^= 1) {
    if (k0 + BC <= last) fetch(k0 + BC, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // this tile's K and V
    __syncthreads();
    const T *sk = skv[buf][0], *sv = skv[buf][1];
    float s[NC][4] = {};
    for (int j = 0; j < NC; j++) {
      uint32_t b[KD][2];
      rows_b<T, KD, LD>(b, sk, 8 * j);
      for (int kk = 0; kk < KD; kk++) mma16816<T>(s[j], qa[kk], b[kk]);
    }
    // Mask, scale, and each row's max over the tile. Key 0 is in the
    // first tile and every row sees it, so the running max is finite.
    float mx[2] = {-INFINITY, -INFINITY};
    for (int j = 0; j < NC; j++)
      for (int i = 0; i < 4; i++) {
        const int k = k0 + 8 * j + 2 * tq + (i & 1), r = i >> 1;
        const float v = k <= q[r] && k < t ? s[j][i] * scale2 : -INFINITY;
        s[j][i] = v;
        mx[r] = fmaxf(mx[r], v);
      }
    float alpha[2];
    for (int r = 0; r < 2; r++) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);
      alpha[r] = exp2f(m[r] - m_new);
      m[r] = m_new;
      l[r] *= alpha[r];  // this lane's share of the row's sum
    }
    for (int n = 0; n < ND; n++)
      for (int i = 0; i < 4; i++) o[n][i] *= alpha[i >> 1];
    // The weights, packed as the A operand of P . V, 16 keys at a time.
    for (int kk = 0; kk < BC / 16; kk++) {
      uint32_t pa[4];
      for (int half = 0; half < 2; half++) {
        float* sj = s[2 * kk + half];
        const float p0 = exp2f(sj[0] - m[0]), p1 = exp2f(sj[1] - m[0]);
        const float p2 = exp2f(sj[2] - m[1]), p3 = exp2f(sj[3] - m[1]);
        l[0] += p0 + p1, l[1] += p2 + p3;
        pa[2 * half] = pack2<T>(p0, p1);
        pa[2 * half + 1] = pack2<T>(p2, p3);
      }
      accumulate<T, ND, LD>(o, pa, sv, 16 * kk);
    }
    __syncthreads();  // everyone is done with this buffer before it is refilled
  }
  T* out = y + (size_t)(bh / heads) * t * c + h * HD;
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    if (q[r] >= t) continue;
    for (int n = 0; n < ND; n++)
      for (int i = 0; i < 2; i++)
        out[(size_t)q[r] * c + 8 * n + 2 * tq + i] = from_f<T>(o[n][2 * r + i] / l[r]);
    if (tq == 0) lse[(size_t)bh * t + q[r]] = m[r] * 0.6931471805599453f + logf(l[r]);
  }
}

// ---- backward, part 1: dQ, and delta = rowsum(dY * Y) -------------------
// A block per (64 query rows, batch x head), over the key tiles up to its
// last row; each warp keeps its 16 rows' dQ in registers. Runs before part
// 2, which reads delta.

template <typename T, int HD>
__device__ void flash_backward_dq(const T* qkv, const T* y, const T* dy, const float* lse,
                                  float* delta, T* dqkv, int t, int heads, float scale) {
  constexpr int BR = WARPS * 16, BC = 64, LD = HD + 8, KD = HD / 16, ND = HD / 8;
  static_assert(BR == BC, "the Q and dY tiles lie in the second K and V buffer");
  __shared__ __align__(16) T skv[2][2][BC * LD];  // [buffer][K, V]
  __shared__ float sl[BR], sd[BR];
  T *sq = skv[1][0], *sdo = skv[1][1];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int bh = blockIdx.y, h = bh % heads;
  const int r0 = (gridDim.x - 1 - blockIdx.x) * BR;
  const int c = heads * HD;
  const size_t stride = 3 * (size_t)c;
  const size_t b0 = (size_t)(bh / heads) * t;
  const T* base = qkv + b0 * stride + h * HD;
  const T* dyb = dy + b0 * c + h * HD;
  const T* yb = y + b0 * c + h * HD;
  const float scale2 = scale * 1.4426950408889634f;  // log2(e)
  const auto fetch = [&](int k0, int buf) {
    load_tile<T, HD, LD>(skv[buf][0], base + c, stride, k0, BC, t);
    load_tile<T, HD, LD>(skv[buf][1], base + 2 * c, stride, k0, BC, t);
  };

  load_tile<T, HD, LD>(sq, base, stride, r0, BR, t);
  load_tile<T, HD, LD>(sdo, dyb, c, r0, BR, t);
  cp_async_commit();
  fetch(0, 0);
  cp_async_commit();
  {
    // Two threads per row: row `me`, every other column.
    const int me = threadIdx.x / 2, half = threadIdx.x % 2, q = r0 + me;
    float dot = 0.f;
    if (q < t)
      for (int d = half; d < HD; d += 2) dot += to_f(dyb[(size_t)q * c + d]) * to_f(yb[(size_t)q * c + d]);
    dot += __shfl_xor_sync(0xffffffffu, dot, 1);
    if (half == 0) {
      sd[me] = dot;
      sl[me] = q < t ? lse[(size_t)bh * t + q] * 1.4426950408889634f : 0.f;
      if (q < t) delta[(size_t)bh * t + q] = dot;
    }
  }
  cp_async_wait<1>();  // the Q and dY tiles
  __syncthreads();
  const int row = warp * 16 + g;
  uint32_t qa[KD][4], da[KD][4];
  load_rows<T, KD, LD>(qa, sq + row * LD + 2 * tq);
  load_rows<T, KD, LD>(da, sdo + row * LD + 2 * tq);
  const int q[2] = {r0 + row, r0 + row + 8};
  const float lr[2] = {sl[row], sl[row + 8]}, dr[2] = {sd[row], sd[row + 8]};
  float acc[ND][4] = {};
  __syncthreads();  // every warp has its rows before their buffer is refilled

  const int last = min(t, r0 + BR) - 1;
  for (int k0 = 0, buf = 0; k0 <= last; k0 += BC, buf ^= 1) {
    if (k0 + BC <= last) fetch(k0 + BC, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // this tile's K and V
    __syncthreads();
    const T *sk = skv[buf][0], *sv = skv[buf][1];
    for (int kk = 0; kk < BC / 16; kk++) {
      float sc[2][4], dp[2][4];
      product_t<T, KD, LD>(sc, qa, sk, 16 * kk);
      product_t<T, KD, LD>(dp, da, sv, 16 * kk);
      for (int half = 0; half < 2; half++)
        for (int i = 0; i < 4; i++) {
          const int k = k0 + 16 * kk + 8 * half + 2 * tq + (i & 1), r = i >> 1;
          const float p = k <= q[r] && q[r] < t ? exp2f(sc[half][i] * scale2 - lr[r]) : 0.f;
          sc[half][i] = p * (dp[half][i] - dr[r]);
        }
      uint32_t pa[4];
      pack_rows<T>(pa, sc);
      accumulate<T, ND, LD>(acc, pa, sk, 16 * kk);
    }
    __syncthreads();  // everyone is done with this buffer before it is refilled
  }
  store_acc<T, ND>(dqkv + b0 * stride + h * HD, stride, acc, scale, r0 + row, t);
}

// ---- backward, part 2: dK and dV ----------------------------------------
// A block per (64 keys, batch x head), over the query tiles from its first
// key on. Each warp owns 16 keys and works on the transposed tiles (keys x
// queries), keeping its dK and dV in registers.

template <typename T, int HD>
__device__ void flash_backward_dkv(const T* qkv, const T* dy, const float* lse,
                                   const float* delta, T* dqkv, int t, int heads, float scale) {
  constexpr int BK = WARPS * 16, BQ = 64, LD = HD + 8, KD = HD / 16, ND = HD / 8;
  static_assert(BK == BQ, "the K and V tiles lie in the second Q and dY buffer");
  __shared__ __align__(16) T sqd[2][2][BQ * LD];  // [buffer][Q, dY]
  __shared__ __align__(16) float sl[2][BQ], sd[2][BQ];  // each row's lse and delta
  T *sk = sqd[1][0], *sv = sqd[1][1];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int bh = blockIdx.y, h = bh % heads;
  const int k0 = blockIdx.x * BK;
  const int c = heads * HD;
  const size_t stride = 3 * (size_t)c;
  const size_t b0 = (size_t)(bh / heads) * t;
  const T* base = qkv + b0 * stride + h * HD;
  const T* dyb = dy + b0 * c + h * HD;
  const float scale2 = scale * 1.4426950408889634f;  // log2(e)
  const auto fetch = [&](int q0, int buf) {
    load_tile<T, HD, LD>(sqd[buf][0], base, stride, q0, BQ, t);
    load_tile<T, HD, LD>(sqd[buf][1], dyb, c, q0, BQ, t);
    for (int i = threadIdx.x; i < BQ; i += blockDim.x) {
      const bool in = q0 + i < t;
      const size_t at = in ? (size_t)bh * t + q0 + i : 0;
      cp_async4(&sl[buf][i], lse + at, in);
      cp_async4(&sd[buf][i], delta + at, in);
    }
  };

  load_tile<T, HD, LD>(sk, base + c, stride, k0, BK, t);
  load_tile<T, HD, LD>(sv, base + 2 * c, stride, k0, BK, t);
  cp_async_commit();
  fetch(k0, 0);
  cp_async_commit();
  cp_async_wait<1>();  // the K and V tiles
  __syncthreads();
  const int row = warp * 16 + g;
  uint32_t ka[KD][4], va[KD][4];
  load_rows<T, KD, LD>(ka, sk + row * LD + 2 * tq);
  load_rows<T, KD, LD>(va, sv + row * LD + 2 * tq);
  const int k[2] = {k0 + row, k0 + row + 8};
  float dk[ND][4] = {}, dv[ND][4] = {};
  __syncthreads();  // every warp has its rows before their buffer is refilled

  for (int q0 = k0, buf = 0; q0 < t; q0 += BQ, buf ^= 1) {
    if (q0 + BQ < t) fetch(q0 + BQ, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // this tile's Q, dY, lse and delta
    __syncthreads();
    const T *sq = sqd[buf][0], *sdo = sqd[buf][1];
    const float *lb = sl[buf], *db = sd[buf];
    for (int kk = 0; kk < BQ / 16; kk++) {
      float st[2][4], dpt[2][4];
      product_t<T, KD, LD>(st, ka, sq, 16 * kk);
      product_t<T, KD, LD>(dpt, va, sdo, 16 * kk);
      for (int half = 0; half < 2; half++)
        for (int i = 0; i < 4; i++) {
          const int j = 16 * kk + 8 * half + 2 * tq + (i & 1), q = q0 + j, r = i >> 1;
          const float p =
              k[r] <= q && q < t ? exp2f(st[half][i] * scale2 - lb[j] * 1.4426950408889634f) : 0.f;
          st[half][i] = p;
          dpt[half][i] = p * (dpt[half][i] - db[j]);
        }
      uint32_t pa[4];
      pack_rows<T>(pa, st);
      accumulate<T, ND, LD>(dv, pa, sdo, 16 * kk);
      pack_rows<T>(pa, dpt);
      accumulate<T, ND, LD>(dk, pa, sq, 16 * kk);
    }
    __syncthreads();  // everyone is done with this buffer before it is refilled
  }
  T* out = dqkv + b0 * stride + h * HD;
  store_acc<T, ND>(out + 2 * c, stride, dv, 1.f, k0 + row, t);
  store_acc<T, ND>(out + c, stride, dk, scale, k0 + row, t);
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
