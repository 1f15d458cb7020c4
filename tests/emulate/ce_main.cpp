// Runs kernels/ce.cu on the CPU (cuda_emu.hpp) for tests/emulated_kernels.rs,
// launched as src/kernels/ce_rows.rs launches them (a block per row;
// 256-thread blocks over the elements).
//   ce_main IN OUT
// IN: bf16 (u32: 1 for bf16 storage, 0 for f32), rows, cols, live, shift
// (u32), eps, scale, g (f32), then z (f32 x rows*cols, rounded to the
// storage type) and the targets (u32 x rows). `shift` places the logits and
// the scaled gradient that many values past a 16-byte boundary (the
// kernels then read a value at a time).
// OUT, from the same logits: ce_loss_grad's losses (f32 x rows) and the
// gradient it left in z (f32 x rows*cols), that gradient times g by
// scale_by (f32 x rows*cols), ce_loss's losses (f32 x rows), and ce_grad's
// gradient for an incoming g (f32 x rows*cols).
#include "ce.cu"

#include <cstdio>
#include <vector>

template <typename T> bool get(FILE* f, T* p, size_t n) { return fread(p, sizeof(T), n, f) == n; }

template <typename T> struct Kernels {
  void (*loss_grad)(T*, const uint32_t*, float*, int, int, float, float);
  void (*scaled)(const T*, const float*, T*, size_t);
  void (*loss)(const T*, const uint32_t*, float*, int, int, float);
  void (*grad)(T*, const uint32_t*, const float*, int, int, float, float);
};

template <typename T>
int run(FILE* in, FILE* out, const uint32_t* head, const float* f, Kernels<T> k) {
  const uint32_t rows = head[1], cols = head[2], live = head[3], shift = head[4];
  const float eps = f[0], scale = f[1], g = f[2];
  const size_t n = (size_t)rows * cols;
  std::vector<float> zf(n);
  std::vector<uint32_t> y(rows);
  if (!get(in, zf.data(), n) || !get(in, y.data(), rows)) return 2;
  std::vector<T> zb(n + shift), dzb(n + shift), z2b(n + shift);
  T *z = zb.data() + shift, *dz = dzb.data() + shift, *z2 = z2b.data() + shift;
  for (size_t i = 0; i < n; i++) z[i] = z2[i] = from_f<T>(zf[i]);
  std::vector<float> loss(rows), loss2(rows);
  const dim3 grid{rows, 1, 1}, threads{std::clamp((cols + 31) / 32 * 32, 32u, 1024u), 1, 1};
  const uint32_t* ys = y.data();
  emu::launch(k.loss, grid, threads, (const T*)z, ys, loss2.data(), (int)cols, (int)live, eps);
  emu::launch(k.grad, grid, threads, z2, ys, (const float*)&g, (int)cols, (int)live, scale, eps);
  emu::launch(k.loss_grad, grid, threads, z, ys, loss.data(), (int)cols, (int)live, scale, eps);
  const unsigned blocks = (unsigned)std::clamp<size_t>((n + 255) / 256, 1, 65535);
  emu::launch(k.scaled, dim3{blocks, 1, 1}, dim3{256, 1, 1}, (const T*)z, (const float*)&g, dz,
              n);
  std::vector<float> a(n), b(n), c(n);
  for (size_t i = 0; i < n; i++) {
    a[i] = to_f(z[i]);
    b[i] = to_f(dz[i]);
    c[i] = to_f(z2[i]);
  }
  const bool ok = fwrite(loss.data(), 4, rows, out) == rows && fwrite(a.data(), 4, n, out) == n &&
                  fwrite(b.data(), 4, n, out) == n &&
                  fwrite(loss2.data(), 4, rows, out) == rows && fwrite(c.data(), 4, n, out) == n;
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: ce_main IN OUT\n");
    return 2;
  }
  FILE* in = fopen(argv[1], "rb");
  uint32_t head[5];
  float f[3];
  if (!in || !get(in, head, 5) || !get(in, f, 3)) return 2;
  FILE* out = fopen(argv[2], "wb");
  if (!out) return 1;
  const int rc =
      head[0] ? run<__nv_bfloat16>(in, out, head, f,
                                   {ce_loss_grad_bf16, scale_by_bf16, ce_loss_bf16, ce_grad_bf16})
              : run<float>(in, out, head, f,
                           {ce_loss_grad_f32, scale_by_f32, ce_loss_f32, ce_grad_f32});
  fclose(in);
  return fclose(out) == 0 ? rc : 1;
}
