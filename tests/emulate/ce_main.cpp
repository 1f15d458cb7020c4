// Runs ce_loss_grad and scale_by of kernels/ce.cu on the CPU (cuda_emu.hpp)
// for tests/emulated_kernels.rs, launched as src/kernels/ce_rows.rs launches
// them (a block per row; 256-thread blocks over the elements).
//   ce_main IN OUT
// IN: bf16 (u32: 1 for bf16 storage, 0 for f32), rows, cols, live (u32),
// eps, scale, g (f32), then z (f32 x rows*cols, rounded to the storage
// type) and the targets (u32 x rows). OUT: the losses (f32 x rows), the
// gradient left in z (f32 x rows*cols), and that gradient times g by
// scale_by (f32 x rows*cols).
#include "ce.cu"

#include <cstdio>
#include <vector>

template <typename T> bool get(FILE* f, T* p, size_t n) { return fread(p, sizeof(T), n, f) == n; }

template <typename T>
int run(FILE* in, FILE* out, uint32_t rows, uint32_t cols, uint32_t live, float eps, float scale,
        float g, void (*loss_grad)(T*, const uint32_t*, float*, int, int, float, float),
        void (*scaled)(const T*, const float*, T*, size_t)) {
  const size_t n = (size_t)rows * cols;
  std::vector<float> zf(n);
  std::vector<uint32_t> y(rows);
  if (!get(in, zf.data(), n) || !get(in, y.data(), rows)) return 2;
  std::vector<T> z(n), dz(n);
  for (size_t i = 0; i < n; i++) z[i] = from_f<T>(zf[i]);
  std::vector<float> loss(rows);
  const unsigned threads = std::clamp((cols + 31) / 32 * 32, 32u, 1024u);
  emu::launch(loss_grad, dim3{rows, 1, 1}, dim3{threads, 1, 1}, z.data(), (const uint32_t*)y.data(),
              loss.data(), (int)cols, (int)live, scale, eps);
  const unsigned blocks = (unsigned)std::clamp<size_t>((n + 255) / 256, 1, 65535);
  emu::launch(scaled, dim3{blocks, 1, 1}, dim3{256, 1, 1}, (const T*)z.data(), (const float*)&g,
              dz.data(), n);
  std::vector<float> a(n), b(n);
  for (size_t i = 0; i < n; i++) {
    a[i] = to_f(z[i]);
    b[i] = to_f(dz[i]);
  }
  const bool ok = fwrite(loss.data(), 4, rows, out) == rows && fwrite(a.data(), 4, n, out) == n &&
                  fwrite(b.data(), 4, n, out) == n;
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: ce_main IN OUT\n");
    return 2;
  }
  FILE* in = fopen(argv[1], "rb");
  uint32_t head[4];
  float f[3];
  if (!in || !get(in, head, 4) || !get(in, f, 3)) return 2;
  FILE* out = fopen(argv[2], "wb");
  if (!out) return 1;
  const int rc =
      head[0] ? run<__nv_bfloat16>(in, out, head[1], head[2], head[3], f[0], f[1], f[2],
                                   ce_loss_grad_bf16, scale_by_bf16)
              : run<float>(in, out, head[1], head[2], head[3], f[0], f[1], f[2], ce_loss_grad_f32,
                           scale_by_f32);
  fclose(in);
  return fclose(out) == 0 ? rc : 1;
}
