// Runs the row softmax (kernels/rows.cu) and the causal attention's in-place
// softmax (kernels/attention.cu), forward and backward, on the CPU
// (cuda_emu.hpp) for tests/emulated_kernels.rs, launched as row_groups in
// src/kernels/cuda.rs launches them: a warp per row, eight a block, for rows
// up to 2048; a block per row beyond.
//   softmax_main IN OUT
// IN: bf16 (u32: 1 for bf16 storage, 0 for f32), rows, cols (u32), then x
// and g (f32 x rows*cols each), rounded to the storage type.
// OUT: softmax(x), softmax_bwd(that, g), the causal softmax of x (row r is
// query r % cols) and causal_softmax_grad(that, g), rows*cols each, as f32.
#include "attention.cu"
#include "rows.cu"

#include <cstdio>
#include <vector>

template <typename T> struct Kernels {
  void (*fwd)(const T*, T*, int, int);
  void (*bwd)(const T*, const T*, T*, int, int);
  void (*causal)(T*, int, int);
  void (*causal_grad)(const T*, T*, int, int);
};

template <typename T> int run(FILE* in, FILE* out, int rows, int cols, Kernels<T> k) {
  const size_t n = (size_t)rows * cols;
  std::vector<float> f(2 * n);
  if (fread(f.data(), 4, 2 * n, in) != 2 * n) return 2;
  std::vector<T> x(n), g(n), y(n), dx(n);
  for (size_t i = 0; i < n; i++) x[i] = from_f<T>(f[i]), g[i] = from_f<T>(f[n + i]);
  const bool long_rows = cols > 2048;
  const dim3 grid = long_rows ? dim3{(unsigned)rows, 1, 1} : dim3{(unsigned)(rows + 7) / 8, 1, 1};
  const dim3 block = long_rows ? dim3{(unsigned)std::min((cols + 31) / 32 * 32, 1024), 1, 1}
                               : dim3{32, 8, 1};
  emu::launch(k.fwd, grid, block, (const T*)x.data(), y.data(), cols, rows);
  emu::launch(k.bwd, grid, block, (const T*)y.data(), (const T*)g.data(), dx.data(), cols, rows);
  std::vector<T> p = x, dp = g;  // both in place
  emu::launch(k.causal, grid, block, p.data(), cols, rows);
  emu::launch(k.causal_grad, grid, block, (const T*)p.data(), dp.data(), cols, rows);
  std::vector<float> all;
  for (const auto* v : {&y, &dx, &p, &dp})
    for (auto e : *v) all.push_back(to_f(e));
  return fwrite(all.data(), 4, all.size(), out) == all.size() ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: softmax_main IN OUT\n");
    return 2;
  }
  FILE* in = fopen(argv[1], "rb");
  uint32_t h[3];
  if (!in || fread(h, 4, 3, in) != 3) return 2;
  FILE* out = fopen(argv[2], "wb");
  if (!out) return 1;
  const int rc =
      h[0] ? run<__nv_bfloat16>(in, out, h[1], h[2],
                                {softmax_fwd_bf16, softmax_bwd_bf16, causal_softmax_bf16,
                                 causal_softmax_grad_bf16})
           : run<float>(in, out, h[1], h[2],
                        {softmax_fwd_f32, softmax_bwd_f32, causal_softmax_f32, causal_softmax_grad_f32});
  fclose(in);
  return fclose(out) == 0 ? rc : 1;
}
