// One warp's 16 x 8 x 16 matrix product on tensor cores (PTX
// mma.sync.m16n8k16, f16 or bf16 in, f32 accumulators), with the operands'
// documented register layout, so that a kernel can keep its tiles in
// registers and work on them element by element (kernels/flash.cu).
//
// Lane l, g = l / 4, t = l % 4; each 32-bit register holds two values, the
// lower column (or k) in the low half:
//   A (16 x 16, row-major): a[0] row g, k 2t..2t+1; a[1] row g+8, same k;
//                           a[2] row g, k 2t+8..2t+9; a[3] row g+8, same k
//   B (16 x 8, k x n):      b[0] k 2t..2t+1, column g; b[1] k 2t+8..2t+9
//   C (16 x 8, f32):        c[0..1] row g, columns 2t..2t+1; c[2..3] row g+8
// So a C tile's two 8-column halves, packed, are the A operand of the next
// product over those 16 columns (FlashAttention-2's P . V).
//
// B operands come from shared memory through ldmatrix (ldsm below): one
// instruction gives a lane its registers of four 8 x 8 matrices, where
// loading them value by value took up to eight loads and the shifts to
// pack them for every product.
//
// Without a GPU (tests/emulate/), the same product is computed in f32 from
// the warp's registers, exchanged through shared memory.
#pragma once
#include "common.cuh"
#include <string.h>
#include <type_traits>

// The 16 bits of one f16 or bf16 value.
template <typename T> __device__ __forceinline__ uint32_t bits16(T x) {
  uint16_t u;
  memcpy(&u, &x, 2);
  return u;
}

template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return bits16(from_f<T>(lo)) | bits16(from_f<T>(hi)) << 16;
}

// Two values that are adjacent in memory (4-byte aligned), as one register.
template <typename T> __device__ __forceinline__ uint32_t load2(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

template <typename T> __device__ __forceinline__ float half_of(uint32_t w, int high) {
  const uint16_t u = high ? w >> 16 : w & 0xffffu;
  T x;
  memcpy(&x, &u, 2);
  return to_f(x);
}

// c += a . b
template <typename T> __device__ __forceinline__ void mma16816(float* c, const uint32_t* a, const uint32_t* b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  // Each lane's registers into a table per warp (one warp barrier), then
  // every lane reads the rows and columns it needs: lanes 4g + s hold row
  // g's k 2s, 2s + 1 (and + 8), lanes 4n + s column n's.
  __shared__ uint32_t table[32][32][6];
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  uint32_t(*w)[6] = table[(threadIdx.x + blockDim.x * threadIdx.y) / 32];
  for (int i = 0; i < 4; i++) w[lane][i] = a[i];
  w[lane][4] = b[0], w[lane][5] = b[1];
  __syncwarp();
  float acc[4] = {c[0], c[1], c[2], c[3]};
  for (int s = 0; s < 4; s++) {
    const uint32_t *ra = w[4 * g + s], *rb0 = w[8 * t + s] + 4, *rb1 = w[8 * t + 4 + s] + 4;
    for (int upper = 0; upper < 2; upper++)
      for (int j = 0; j < 2; j++) {
        const float x0 = half_of<T>(ra[2 * upper], j), x1 = half_of<T>(ra[2 * upper + 1], j);
        const float y0 = half_of<T>(rb0[upper], j), y1 = half_of<T>(rb1[upper], j);
        acc[0] += x0 * y0, acc[1] += x0 * y1, acc[2] += x1 * y0, acc[3] += x1 * y1;
      }
  }
  __syncwarp();  // everyone has read the table before it is written again
  for (int i = 0; i < 4; i++) c[i] = acc[i];
#endif
}

// ldmatrix.x4 (TRANS: .trans): lane l gives the address of row l % 8 of
// matrix l / 8 (8 values of 16 bits, 16-byte aligned, in shared memory)
// and gets in r[i] two values of matrix i: row l / 4, columns 2 (l % 4)
// and 2 (l % 4) + 1; with TRANS the same of the transposed matrix (column
// l / 4, rows 2 (l % 4) and 2 (l % 4) + 1), the lower index in the low
// half. Every lane of the warp must call it.
template <bool TRANS, typename T> __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const T* p) {
#if defined(__CUDA_ARCH__)
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  if constexpr (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
#else
  // The rows' addresses from the lanes that hold them.
  const int lane = threadIdx.x % 32;
  for (int i = 0; i < 4; i++) {
    if constexpr (TRANS) {
      const T* lo = __shfl_sync(0xffffffffu, p, 8 * i + 2 * (lane % 4));
      const T* hi = __shfl_sync(0xffffffffu, p, 8 * i + 2 * (lane % 4) + 1);
      r[i] = bits16(lo[lane / 4]) | bits16(hi[lane / 4]) << 16;
    } else {
      r[i] = load2(__shfl_sync(0xffffffffu, p, 8 * i + lane / 4) + 2 * (lane % 4));
    }
  }
#endif
}

// ldmatrix.x2: as ldsm_x4 for two matrices, whose rows' addresses lanes
// 0 to 15 give (the other lanes' are not read).
template <typename T> __device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], const T* p) {
#if defined(__CUDA_ARCH__)
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(a)
               : "memory");
#else
  const int lane = threadIdx.x % 32;
  for (int i = 0; i < 2; i++) r[i] = load2(__shfl_sync(0xffffffffu, p, 8 * i + lane / 4) + 2 * (lane % 4));
#endif
}
