// Runs the layer norm's forward and one-pass backward (kernels/rows.cu) and the dense
// layer's bias gradient (kernels/dense.cu), both ending in sum_chunks
// (kernels/common.cuh), on the CPU (cuda_emu.hpp) for
// tests/emulated_kernels.rs, launched as src/kernels/layer_norm.rs and
// src/kernels/dense_cuda.rs launch them.
//   rows_main IN OUT
// IN: bf16 (u32: 1 for bf16 storage, 0 for f32), rows, cols, warps, per,
// column_per (u32), eps (f32), then x (f32 x rows*cols), w (f32 x cols),
// g (f32 x rows*cols) and b (f32 x cols), rounded to the storage type.
// OUT: dx (rows*cols), dw and db (cols each), the column sums of g (cols),
// the forward's output (rows*cols), and the column sums of g again from the
// packed first stage where rows are whole packs (else the value-a-thread
// one again), and the bias rows of b (rows*cols) from the value-a-thread
// kernel, then from the packed one where rows are whole packs (else the
// first again), as f32.
#include "dense.cu"
#include "rows.cu"

#include <cstdio>
#include <vector>

template <typename T> bool get(FILE* f, T* p, size_t n) { return fread(p, sizeof(T), n, f) == n; }

template <typename T>
std::vector<T> read_as(FILE* in, size_t n, bool* ok) {
  std::vector<float> f(n);
  *ok = *ok && get(in, f.data(), n);
  std::vector<T> out(n);
  for (size_t i = 0; i < n; i++) out[i] = from_f<T>(f[i]);
  return out;
}

template <typename T>
int run(FILE* in, FILE* out, const uint32_t* h, float eps,
        void (*fwd)(const T*, const T*, const T*, T*, int, int, float),
        void (*bwd)(const T*, const T*, const T*, T*, float*, int, int, int, float),
        void (*wb_final)(const float*, T*, int, int),
        void (*col_partial)(const T*, float*, int, int, int),
        void (*col_partial_packed)(const T*, float*, int, int, int),
        void (*col_final)(const float*, T*, int, int),
        void (*bias_rows)(const T*, T*, size_t, int),
        void (*bias_rows_packed)(const T*, T*, size_t, int)) {
  const int rows = h[1], cols = h[2], warps = h[3], per = h[4], col_per = h[5];
  const size_t n = (size_t)rows * cols;
  bool ok = true;
  auto x = read_as<T>(in, n, &ok);
  auto w = read_as<T>(in, cols, &ok);
  auto g = read_as<T>(in, n, &ok);
  auto b = read_as<T>(in, cols, &ok);
  if (!ok) return 2;
  // The forward, launched as row_groups (src/kernels/cuda.rs) launches it:
  // a warp per row, eight a block, for rows up to 2048; a block per row
  // beyond.
  std::vector<T> y(n);
  const dim3 fgrid = cols > 2048 ? dim3{(unsigned)rows, 1, 1} : dim3{(unsigned)(rows + 7) / 8, 1, 1};
  const dim3 fblock = cols > 2048 ? dim3{(unsigned)std::min((cols + 31) / 32 * 32, 1024), 1, 1}
                                  : dim3{32, 8, 1};
  emu::launch(fwd, fgrid, fblock, (const T*)x.data(), (const T*)w.data(), (const T*)b.data(),
              y.data(), cols, rows, eps);
  // The layer norm: one kernel, then the sum over its blocks.
  const unsigned blocks = (rows + per - 1) / per;
  std::vector<T> dx(n), dwb(2 * cols);
  std::vector<float> partial((size_t)blocks * 2 * cols);
  emu::launch(bwd, dim3{blocks, 1, 1}, dim3{32, (unsigned)warps, 1}, (const T*)x.data(),
              (const T*)w.data(), (const T*)g.data(), dx.data(), partial.data(), cols, rows, per,
              eps);
  const unsigned tiles = (2 * cols + 31) / 32;
  emu::launch(wb_final, dim3{tiles, 1, 1}, dim3{32, SUM_CHUNKS_Y, 1}, (const float*)partial.data(),
              dwb.data(), (int)blocks, cols);
  // The bias gradient: partial sums over chunks of col_per rows, then theirs,
  // launched as src/kernels/dense_cuda.rs launches them.
  const unsigned chunks = (rows + col_per - 1) / col_per;
  auto column_sums = [&](auto partial_kernel, int per_thread) {
    std::vector<float> cpart((size_t)chunks * cols);
    std::vector<T> sums(cols);
    const unsigned tiles = (cols + 32 * per_thread - 1) / (32 * per_thread);
    emu::launch(partial_kernel, dim3{chunks, tiles, 1}, dim3{32, 8, 1}, (const T*)g.data(),
                cpart.data(), rows, cols, col_per);
    emu::launch(col_final, dim3{(unsigned)(cols + 31) / 32, 1, 1}, dim3{32, SUM_CHUNKS_Y, 1},
                (const float*)cpart.data(), sums.data(), (int)chunks, cols);
    return sums;
  };
  constexpr int V = 16 / sizeof(T);
  const auto colsum = column_sums(col_partial, 1);
  const auto colsum_packed =
      cols % V == 0 ? column_sums(col_partial_packed, V) : column_sums(col_partial, 1);
  std::vector<float> all;
  for (auto v : dx) all.push_back(to_f(v));
  for (auto v : dwb) all.push_back(to_f(v));
  for (auto v : colsum) all.push_back(to_f(v));
  for (auto v : y) all.push_back(to_f(v));
  for (auto v : colsum_packed) all.push_back(to_f(v));
  // The bias rows, launched as src/kernels/dense_cuda.rs launches them (a
  // row stride of at most 1024 rows).
  auto rows_of = [&](auto kernel, int per_thread) {
    std::vector<T> out(n);
    const unsigned threads = cols / per_thread;
    const unsigned block = std::min((threads + 31) / 32 * 32, 256u);
    emu::launch(kernel, dim3{(threads + block - 1) / block, (unsigned)std::min(rows, 1024), 1},
                dim3{block, 1, 1}, (const T*)b.data(), out.data(), (size_t)rows, cols);
    return out;
  };
  for (auto v : rows_of(bias_rows, 1)) all.push_back(to_f(v));
  for (auto v : cols % V == 0 ? rows_of(bias_rows_packed, V) : rows_of(bias_rows, 1))
    all.push_back(to_f(v));
  return fwrite(all.data(), 4, all.size(), out) == all.size() ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: rows_main IN OUT\n");
    return 2;
  }
  FILE* in = fopen(argv[1], "rb");
  uint32_t h[6];
  float eps = 0.f;
  if (!in || !get(in, h, 6) || !get(in, &eps, 1)) return 2;
  FILE* out = fopen(argv[2], "wb");
  if (!out) return 1;
  const int rc = h[0] ? run<__nv_bfloat16>(in, out, h, eps, layer_norm_fwd_bf16, layer_norm_bwd_bf16,
                                           layer_norm_bwd_wb_final_bf16,
                                           column_sum_partial_bf16, column_sum_partial_packed_bf16,
                                           column_sum_final_bf16, bias_rows_bf16,
                                           bias_rows_packed_bf16)
                      : run<float>(in, out, h, eps, layer_norm_fwd_f32, layer_norm_bwd_f32,
                                   layer_norm_bwd_wb_final_f32,
                                   column_sum_partial_f32, column_sum_partial_packed_f32,
                                   column_sum_final_f32, bias_rows_f32, bias_rows_packed_f32);
  fclose(in);
  return fclose(out) == 0 ? rc : 1;
}
