// CPU stand-in for CUDA's WMMA API (see ../cuda_emu.hpp), 16 x 16 x 16
// tiles only. Every lane holds the whole tile, row-major; products are
// exact f32 sums of f32 products, as tensor cores take half and bfloat16.
// Each call is a warp barrier, as the _sync calls are warp-collective.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

inline float value(float x) { return x; }
inline float value(__half x) { return __half2float(x); }
inline float value(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename Use, int M, int N, int K, typename T, typename L = void> struct fragment {
  static constexpr int num_elements = 256;
  T x[256];
};

template <typename U, typename T, typename L>
void load_matrix_sync(fragment<U, 16, 16, 16, T, L>& f, const T* p, unsigned ld) {
  __syncwarp();
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++)
      f.x[r * 16 + c] = std::is_same_v<L, row_major> ? p[r * ld + c] : p[c * ld + r];
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ld,
                             layout_t l) {
  __syncwarp();
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) f.x[r * 16 + c] = l == mem_row_major ? p[r * ld + c] : p[c * ld + r];
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ld,
                              layout_t l) {
  __syncwarp();
  if (emu::lane_id() != 0) return;
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) (l == mem_row_major ? p[r * ld + c] : p[c * ld + r]) = f.x[r * 16 + c];
}
template <typename U, typename T, typename L>
void fill_fragment(fragment<U, 16, 16, 16, T, L>& f, T v) {
  for (auto& x : f.x) x = v;
}
template <typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  __syncwarp();
  float out[256];
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      float s = c.x[i * 16 + j];
      for (int k = 0; k < 16; k++) s += value(a.x[i * 16 + k]) * value(b.x[k * 16 + j]);
      out[i * 16 + j] = s;
    }
  for (int i = 0; i < 256; i++) d.x[i] = out[i];
}
}  // namespace nvcuda::wmma
