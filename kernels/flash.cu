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
// delta [b * heads, t] in f32. A block owns 64 rows (queries, or keys in
// dK/dV); each warp owns 16 of them (MT = 1: 4 warps, the `_16` kernels'
// default) or 32 (MT = 2: 2 warps, the `_r32` kernels) and keeps their
// tiles in registers, as kernels/mma.cuh lays them out. Shared memory
// holds only the bf16/f16 tiles of the inputs, 64 rows at a time, rows
// padded by 8 values (16 bytes) so that the 8 rows an ldmatrix reads fall
// in different banks. A warp of 32 rows multiplies each B operand it
// loads from shared memory by two A operands, so it issues half the
// shared-memory loads per product (FlashAttention-2 gives a warp 32 or
// more rows for this); it holds twice the registers.
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

#include <type_traits>

// Rows a block owns; a block has 4 / MT warps.
#define ROWS 64

// Runs a tile's work `f` as one of its two copies: without the causal mask
// (`f(std::true_type)`) when `all_visible`, else with it. The choice is one
// branch a tile, the same for the whole block.
template <typename F> __device__ __forceinline__ void by_mask(bool all_visible, F&& f) {
  if (all_visible)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// 2^x as the hardware approximates it (PTX ex2.approx.ftz.f32: within
// 2 ulp, results under 2^-126 flushed to zero): one MUFU instruction,
// where exp2f wraps it in a compare and two multiplies for subnormal
// results. A weight that small adds nothing to a row whose sum is at least
// 1 (its maximum's weight). 2^-inf is 0 either way. The emulation uses
// exp2f.
__device__ __forceinline__ float exp2_fast(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// Copies rows [r0, r0 + ROWS) of one head (HD values at `src`, rows
// `stride` apart) into `dst` [ROWS][LD], zeros past row t: 16-byte copies
// queued by cp.async where the rows are 16-byte aligned (the fused qkv's
// always are unless a width is odd), which the caller commits and waits
// for; one value a load, done at once, otherwise. NT is the block's
// thread count. A round of NT copies covers NT / (HD / V) whole rows, so a
// thread keeps its column and steps its row by that much: its addresses
// are worked out once, where a division and a 64-bit product per copy
// took about 30 instructions.
template <typename T, int HD, int LD, int NT>
__device__ __forceinline__ void load_tile(T* dst, const T* src, size_t stride, int r0, int t) {
  constexpr int V = 16 / sizeof(T), PER_ROW = HD / V;
  if (HD % V == 0 && (size_t)src % 16 == 0 && stride % V == 0) {
    static_assert(NT % PER_ROW == 0 && ROWS % (NT / PER_ROW) == 0, "whole rows a round");
    constexpr int STEP = NT / PER_ROW;  // rows a round
    const int r = threadIdx.x / PER_ROW, d = threadIdx.x % PER_ROW * V;
    const T* from = src + (size_t)(r0 + r) * stride + d;
    T* to = dst + r * LD + d;
    NO_UNROLL for (int n = r; n < ROWS; n += STEP) {
      const bool in = r0 + n < t;
      cp_async16(to, in ? from : src, in);
      from += STEP * stride;
      to += STEP * LD;
    }
    return;
  }
  for (int i = threadIdx.x; i < ROWS * HD; i += NT) {
    const int r = i / HD, d = i % HD;
    dst[r * LD + d] = r0 + r < t ? src[(size_t)(r0 + r) * stride + d] : from_f<T>(0.f);
  }
}

// A warp's A operands for its 16 rows of a [rows][LD] tile in shared
// memory, HD / 16 of them (16 columns each). `m` points at row g, column
// 2t of the warp's rows.
template <typename T, int KD, int LD>
__device__ __forceinline__ void load_rows(uint32_t (&a)[KD][4], const T* m) {
  UNROLL for (int kk = 0; kk < KD; kk++) {
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
  UNROLL for (int kk = 0; kk + 1 < KD; kk += 2) {
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

// s[mt][half] = a[mt] . rows^T for the 16 rows (two 8-row halves) of
// `tile` from row r, for each of the warp's MT row tiles: a product over
// HD, as S = Q K^T. Each B operand is loaded once for the MT products.
template <typename T, int KD, int LD, int MT>
__device__ __forceinline__ void product_t(float (&s)[MT][2][4], const uint32_t (&a)[MT][KD][4],
                                          const T* tile, int r) {
  UNROLL for (int half = 0; half < 2; half++) {
    uint32_t b[KD][2];
    rows_b<T, KD, LD>(b, tile, r + 8 * half);
    UNROLL for (int mt = 0; mt < MT; mt++) {
      UNROLL for (int i = 0; i < 4; i++) s[mt][half][i] = 0.f;
      UNROLL for (int kk = 0; kk < KD; kk++) mma16816<T>(s[mt][half], a[mt][kk], b[kk]);
    }
  }
}

// acc[mt][n] += pa[mt] . tile[r..r+16][8n..8n+8] for every n and each of
// the warp's MT row tiles: pa the packed A operands of 16 columns, against
// 16 rows of `tile`, as O += P V. The B operands (rows r + 2t, r + 2t + 1
// and 8 further, column 8n + g) come transposed by ldmatrix, two n at a
// load: lane l points at row r + 8 (i % 2) + l % 8, columns from
// 8 (n + i / 2), for i = l / 8.
template <typename T, int ND, int LD, int MT>
__device__ __forceinline__ void accumulate(float (&acc)[MT][ND][4], const uint32_t (&pa)[MT][4],
                                           const T* tile, int r) {
  static_assert(ND % 2 == 0, "two 8-column slices a load");
  const int lane = threadIdx.x % 32, i = lane / 8;
  const T* p = tile + (r + 8 * (i % 2) + lane % 8) * LD + 8 * (i / 2);
  UNROLL for (int n = 0; n < ND; n += 2) {
    uint32_t x[4];
    ldsm_x4<true>(x, p + 8 * n);
    const uint32_t b0[2] = {x[0], x[1]}, b1[2] = {x[2], x[3]};
    UNROLL for (int mt = 0; mt < MT; mt++) {
      mma16816<T>(acc[mt][n], pa[mt], b0);
      mma16816<T>(acc[mt][n + 1], pa[mt], b1);
    }
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
  UNROLL for (int r = 0; r < 2; r++) {
    const int q = row + 8 * r;
    if (q >= t) continue;
    UNROLL for (int n = 0; n < ND; n++)
      UNROLL for (int i = 0; i < 2; i++)
        dst[(size_t)q * stride + 8 * n + 2 * tq + i] = from_f<T>(scale * acc[n][2 * r + i]);
  }
}

// ---- forward: a block per (64 query rows, batch x head) ----------------
// Each warp keeps its query rows' scores, weights and output in registers
// (kernels/mma.cuh's layout), 16 rows a tile: lane (g, t) holds rows g and
// g + 8 of every 8-column slice, columns 2t and 2t + 1. A row's max and
// sum are reduced over the 4 lanes that share it. Row maxima are kept in
// base 2 (scaled by scale x log2(e)) for exp2; each score is scaled in the
// fused multiply-add that subtracts its row's max. Tiles with no masked
// score (below the diagonal, inside t) skip the mask (`all_visible`), as
// do the backward's: the comparisons and selects per score were as many
// instructions as the exp2 and the scaling, on units the products do not
// use but which FlashAttention-2 found can bound the kernel.

template <typename T, int HD, int MT>
__device__ void flash_forward(const T* qkv, T* y, float* lse, int t, int heads, float scale) {
  constexpr int BR = ROWS, BC = 64, LD = HD + 8, RW = 16 * MT, NT = 128 / MT;
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
    load_tile<T, HD, LD, NT>(skv[buf][0], base + c, stride, k0, t);
    load_tile<T, HD, LD, NT>(skv[buf][1], base + 2 * c, stride, k0, t);
  };

  load_tile<T, HD, LD, NT>(sq, base, stride, r0, t);
  cp_async_commit();
  fetch(0, 0);
  cp_async_commit();
  cp_async_wait<1>();  // the Q tile
  __syncthreads();
  uint32_t qa[MT][KD][4];
  float o[MT][ND][4] = {};
  float m[MT][2], l[MT][2];
  int q[MT][2];
  UNROLL for (int mt = 0; mt < MT; mt++) {
    const int row = warp * RW + 16 * mt + g;
    load_rows<T, KD, LD>(qa[mt], sq + row * LD + 2 * tq);
    UNROLL for (int r = 0; r < 2; r++) m[mt][r] = -INFINITY, l[mt][r] = 0.f, q[mt][r] = r0 + row + 8 * r;
  }

  const int last = min(t, r0 + BR) - 1;
  for (int k0 = 0, buf = 0; k0 <= last; k0 += BC, buf ^= 1) {
    if (k0 + BC <= last) fetch(k0 + BC, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // this tile's K and V
    __syncthreads();
    const T *sk = skv[buf][0], *sv = skv[buf][1];
    // The tile's products, then (`all_visible`: every key of the tile is
    // at or before every row of the block, and inside t, so nothing is
    // masked) the masked scores' maxima, the rescaled sums and outputs, and
    // the weights times V. Scores stay unscaled: one fused multiply-add
    // scales each and subtracts the row's max before exp2.
    const auto tile = [&](auto all_visible) {
      float s[MT][NC][4] = {};
      UNROLL for (int j = 0; j < NC; j++) {
        uint32_t b[KD][2];
        rows_b<T, KD, LD>(b, sk, 8 * j);
        UNROLL for (int mt = 0; mt < MT; mt++)
          UNROLL for (int kk = 0; kk < KD; kk++) mma16816<T>(s[mt][j], qa[mt][kk], b[kk]);
      }
      UNROLL for (int mt = 0; mt < MT; mt++) {
        // Key 0 is in the first tile and every row sees it, so the running
        // max is finite.
        float mx[2] = {-INFINITY, -INFINITY};
        UNROLL for (int j = 0; j < NC; j++)
          UNROLL for (int i = 0; i < 4; i++) {
            const int k = k0 + 8 * j + 2 * tq + (i & 1), r = i >> 1;
            if (!decltype(all_visible)::value && !(k <= q[mt][r] && k < t)) s[mt][j][i] = -INFINITY;
            mx[r] = fmaxf(mx[r], s[mt][j][i]);
          }
        float alpha[2];
        UNROLL for (int r = 0; r < 2; r++) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
          const float m_new = fmaxf(m[mt][r], mx[r] * scale2);
          alpha[r] = exp2_fast(m[mt][r] - m_new);
          m[mt][r] = m_new;
          l[mt][r] *= alpha[r];  // this lane's share of the row's sum
        }
        UNROLL for (int n = 0; n < ND; n++)
          UNROLL for (int i = 0; i < 4; i++) o[mt][n][i] *= alpha[i >> 1];
      }
      // The weights, packed as the A operands of P . V, 16 keys at a time.
      UNROLL for (int kk = 0; kk < BC / 16; kk++) {
        uint32_t pa[MT][4];
        UNROLL for (int mt = 0; mt < MT; mt++)
          UNROLL for (int half = 0; half < 2; half++) {
            float* sj = s[mt][2 * kk + half];
            const float m0 = -m[mt][0], m1 = -m[mt][1];
            const float p0 = exp2_fast(fmaf(sj[0], scale2, m0));
            const float p1 = exp2_fast(fmaf(sj[1], scale2, m0));
            const float p2 = exp2_fast(fmaf(sj[2], scale2, m1));
            const float p3 = exp2_fast(fmaf(sj[3], scale2, m1));
            l[mt][0] += p0 + p1, l[mt][1] += p2 + p3;
            pa[mt][2 * half] = pack2<T>(p0, p1);
            pa[mt][2 * half + 1] = pack2<T>(p2, p3);
          }
        accumulate<T, ND, LD, MT>(o, pa, sv, 16 * kk);
      }
    };
    by_mask(k0 + BC <= min(r0 + 1, t), tile);
    __syncthreads();  // everyone is done with this buffer before it is refilled
  }
  T* out = y + (size_t)(bh / heads) * t * c + h * HD;
  UNROLL for (int mt = 0; mt < MT; mt++)
    UNROLL for (int r = 0; r < 2; r++) {
      float sum = l[mt][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int qr = q[mt][r];
      if (qr >= t) continue;
      UNROLL for (int n = 0; n < ND; n++)
        UNROLL for (int i = 0; i < 2; i++)
          out[(size_t)qr * c + 8 * n + 2 * tq + i] = from_f<T>(o[mt][n][2 * r + i] / sum);
      if (tq == 0) lse[(size_t)bh * t + qr] = m[mt][r] * 0.6931471805599453f + logf(sum);
    }
}

// ---- backward, part 1: dQ, and delta = rowsum(dY * Y) -------------------
// A block per (64 query rows, batch x head), over the key tiles up to its
// last row; each warp keeps its rows' dQ in registers. Runs before part
// 2, which reads delta.

template <typename T, int HD, int MT>
__device__ void flash_backward_dq(const T* qkv, const T* y, const T* dy, const float* lse,
                                  float* delta, T* dqkv, int t, int heads, float scale) {
  constexpr int BR = ROWS, BC = 64, LD = HD + 8, KD = HD / 16, ND = HD / 8, RW = 16 * MT;
  constexpr int NT = 128 / MT;  // threads a block
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
    load_tile<T, HD, LD, NT>(skv[buf][0], base + c, stride, k0, t);
    load_tile<T, HD, LD, NT>(skv[buf][1], base + 2 * c, stride, k0, t);
  };

  load_tile<T, HD, LD, NT>(sq, base, stride, r0, t);
  load_tile<T, HD, LD, NT>(sdo, dyb, c, r0, t);
  cp_async_commit();
  fetch(0, 0);
  cp_async_commit();
  // Two threads per row: row `me`, every other column (every thread runs
  // the same number of rows, so the shuffle has both of a row's threads).
  for (int me = threadIdx.x / 2; me < BR; me += NT / 2) {
    const int half = threadIdx.x % 2, q = r0 + me;
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
  uint32_t qa[MT][KD][4], da[MT][KD][4];
  int q[MT][2];
  float lr[MT][2], dr[MT][2];
  UNROLL for (int mt = 0; mt < MT; mt++) {
    const int row = warp * RW + 16 * mt + g;
    load_rows<T, KD, LD>(qa[mt], sq + row * LD + 2 * tq);
    load_rows<T, KD, LD>(da[mt], sdo + row * LD + 2 * tq);
    UNROLL for (int r = 0; r < 2; r++)
      q[mt][r] = r0 + row + 8 * r, lr[mt][r] = sl[row + 8 * r], dr[mt][r] = sd[row + 8 * r];
  }
  float acc[MT][ND][4] = {};
  __syncthreads();  // every warp has its rows before their buffer is refilled

  const int last = min(t, r0 + BR) - 1;
  for (int k0 = 0, buf = 0; k0 <= last; k0 += BC, buf ^= 1) {
    if (k0 + BC <= last) fetch(k0 + BC, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // this tile's K and V
    __syncthreads();
    const T *sk = skv[buf][0], *sv = skv[buf][1];
    // `all_visible`: every key of the tile is at or before every row of
    // the block, so nothing is masked. (Rows past t, in the last block,
    // read zeros and are never stored; masked or not, they stay finite.)
    const auto tile = [&](auto all_visible) {
      UNROLL for (int kk = 0; kk < BC / 16; kk++) {
        float sc[MT][2][4], dp[MT][2][4];
        product_t<T, KD, LD, MT>(sc, qa, sk, 16 * kk);
        product_t<T, KD, LD, MT>(dp, da, sv, 16 * kk);
        uint32_t pa[MT][4];
        UNROLL for (int mt = 0; mt < MT; mt++) {
          UNROLL for (int half = 0; half < 2; half++)
            UNROLL for (int i = 0; i < 4; i++) {
              const int k = k0 + 16 * kk + 8 * half + 2 * tq + (i & 1), r = i >> 1;
              const bool in = decltype(all_visible)::value || (k <= q[mt][r] && q[mt][r] < t);
              const float p = in ? exp2_fast(fmaf(sc[mt][half][i], scale2, -lr[mt][r])) : 0.f;
              sc[mt][half][i] = p * (dp[mt][half][i] - dr[mt][r]);
            }
          pack_rows<T>(pa[mt], sc[mt]);
        }
        accumulate<T, ND, LD, MT>(acc, pa, sk, 16 * kk);
      }
    };
    by_mask(k0 + BC <= r0 + 1, tile);
    __syncthreads();  // everyone is done with this buffer before it is refilled
  }
  UNROLL for (int mt = 0; mt < MT; mt++)
    store_acc<T, ND>(dqkv + b0 * stride + h * HD, stride, acc[mt], scale, q[mt][0], t);
}

// ---- backward, part 2: dK and dV ----------------------------------------
// A block per (64 keys, batch x head), over the query tiles from its first
// key on. Each warp owns 16 or 32 keys and works on the transposed tiles
// (keys x queries), keeping its dK and dV in registers.

template <typename T, int HD, int MT>
__device__ void flash_backward_dkv(const T* qkv, const T* dy, const float* lse,
                                   const float* delta, T* dqkv, int t, int heads, float scale) {
  constexpr int BK = ROWS, BQ = 64, LD = HD + 8, KD = HD / 16, ND = HD / 8, RW = 16 * MT;
  constexpr int NT = 128 / MT;  // threads a block
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
    load_tile<T, HD, LD, NT>(sqd[buf][0], base, stride, q0, t);
    load_tile<T, HD, LD, NT>(sqd[buf][1], dyb, c, q0, t);
    for (int i = threadIdx.x; i < BQ; i += NT) {
      const bool in = q0 + i < t;
      const size_t at = in ? (size_t)bh * t + q0 + i : 0;
      cp_async4(&sl[buf][i], lse + at, in);
      cp_async4(&sd[buf][i], delta + at, in);
    }
  };

  load_tile<T, HD, LD, NT>(sk, base + c, stride, k0, t);
  load_tile<T, HD, LD, NT>(sv, base + 2 * c, stride, k0, t);
  cp_async_commit();
  fetch(k0, 0);
  cp_async_commit();
  cp_async_wait<1>();  // the K and V tiles
  __syncthreads();
  uint32_t ka[MT][KD][4], va[MT][KD][4];
  int k[MT][2];
  UNROLL for (int mt = 0; mt < MT; mt++) {
    const int row = warp * RW + 16 * mt + g;
    load_rows<T, KD, LD>(ka[mt], sk + row * LD + 2 * tq);
    load_rows<T, KD, LD>(va[mt], sv + row * LD + 2 * tq);
    k[mt][0] = k0 + row, k[mt][1] = k0 + row + 8;
  }
  float dk[MT][ND][4] = {}, dv[MT][ND][4] = {};
  __syncthreads();  // every warp has its rows before their buffer is refilled

  for (int q0 = k0, buf = 0; q0 < t; q0 += BQ, buf ^= 1) {
    if (q0 + BQ < t) fetch(q0 + BQ, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // this tile's Q, dY, lse and delta
    __syncthreads();
    const T *sq = sqd[buf][0], *sdo = sqd[buf][1];
    const float *lb = sl[buf], *db = sd[buf];
    // `all_visible`: every query of the tile is at or after every key of
    // the block, and inside t: nothing is masked.
    const auto tile = [&](auto all_visible) {
      UNROLL for (int kk = 0; kk < BQ / 16; kk++) {
        float st[MT][2][4], dpt[MT][2][4];
        product_t<T, KD, LD, MT>(st, ka, sq, 16 * kk);
        product_t<T, KD, LD, MT>(dpt, va, sdo, 16 * kk);
        uint32_t pa[MT][4];
        UNROLL for (int mt = 0; mt < MT; mt++) {
          UNROLL for (int half = 0; half < 2; half++)
            UNROLL for (int i = 0; i < 4; i++) {
              const int j = 16 * kk + 8 * half + 2 * tq + (i & 1), q = q0 + j, r = i >> 1;
              const bool in = decltype(all_visible)::value || (k[mt][r] <= q && q < t);
              const float lse2 = lb[j] * 1.4426950408889634f;  // log2(e)
              const float p = in ? exp2_fast(fmaf(st[mt][half][i], scale2, -lse2)) : 0.f;
              st[mt][half][i] = p;
              dpt[mt][half][i] = p * (dpt[mt][half][i] - db[j]);
            }
          pack_rows<T>(pa[mt], st[mt]);
        }
        accumulate<T, ND, LD, MT>(dv, pa, sdo, 16 * kk);
        UNROLL for (int mt = 0; mt < MT; mt++) pack_rows<T>(pa[mt], dpt[mt]);
        accumulate<T, ND, LD, MT>(dk, pa, sq, 16 * kk);
      }
    };
    by_mask(q0 >= k0 + BK - 1 && q0 + BQ <= t, tile);
    __syncthreads();  // everyone is done with this buffer before it is refilled
  }
  T* out = dqkv + b0 * stride + h * HD;
  UNROLL for (int mt = 0; mt < MT; mt++) {
    store_acc<T, ND>(out + 2 * c, stride, dv[mt], 1.f, k[mt][0], t);
    store_acc<T, ND>(out + c, stride, dk[mt], scale, k[mt][0], t);
  }
}

// The kernels for MT row tiles a warp (4 / MT warps a block), named
// flash_{forward,backward_dq,backward_dkv}_{f16,bf16}_{HD}{SUF}.
#define FLASH(T, S, HD, MT, SUF)                                                                     \
  extern "C" __global__ void __launch_bounds__(128 / MT)                                             \
      flash_forward_##S##_##HD##SUF(const T* qkv, T* y, float* lse, int t, int heads, float scale) { \
    flash_forward<T, HD, MT>(qkv, y, lse, t, heads, scale);                                         \
  }                                                                                                  \
  extern "C" __global__ void __launch_bounds__(128 / MT) flash_backward_dq_##S##_##HD##SUF(          \
      const T* qkv, const T* y, const T* dy, const float* lse, float* delta, T* dqkv, int t,         \
      int heads, float scale) {                                                                      \
    flash_backward_dq<T, HD, MT>(qkv, y, dy, lse, delta, dqkv, t, heads, scale);                    \
  }                                                                                                  \
  extern "C" __global__ void __launch_bounds__(128 / MT) flash_backward_dkv_##S##_##HD##SUF(         \
      const T* qkv, const T* dy, const float* lse, const float* delta, T* dqkv, int t,               \
      int heads, float scale) {                                                                      \
    flash_backward_dkv<T, HD, MT>(qkv, dy, lse, delta, dqkv, t, heads, scale);                      \
  }
#define FLASH_ROWS(T, S, HD) FLASH(T, S, HD, 1, ) FLASH(T, S, HD, 2, _r32)
#define FLASH_WIDTHS(T, S) FLASH_ROWS(T, S, 16) FLASH_ROWS(T, S, 32) FLASH_ROWS(T, S, 64)
FLASH_WIDTHS(__half, f16)
FLASH_WIDTHS(__nv_bfloat16, bf16)
