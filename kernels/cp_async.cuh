// Copies from global to shared memory that run while the block computes
// (PTX cp.async, sm_80 and later), so that a tiled kernel can load its
// next tile during the products on the current one. A thread queues
// 16-byte copies, closes them into a group (cp_async_commit), and waits
// until at most N of its groups are still in flight (cp_async_wait<N>);
// the copies are then complete for that thread, and visible to the
// others after a __syncthreads.
//
// Without a GPU (tests/emulate/), a copy happens only when its thread
// waits for its group: as late as the hardware may make it, so that a
// kernel that reads a tile before waiting for it reads the old tile there
// too, and fails its test. With CUDA_EMU_COPIES=early in the environment
// it happens when it is queued instead, as early as the hardware may make
// it, so that a kernel that refills a buffer another warp still reads
// fails too; the tests run both ways.
#pragma once
#include "common.cuh"

#if !defined(__CUDA_ARCH__)
#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>
namespace emu_async {
struct Copy {
  void* dst;
  const void* src;  // null: zero bytes
  int bytes;
};
// CUDA_EMU_COPIES=early (see the top of this file).
inline const bool early = [] {
  const char* e = std::getenv("CUDA_EMU_COPIES");
  return e && std::strcmp(e, "early") == 0;
}();
inline void copy(const Copy& c) {
  if (c.src)
    std::memcpy(c.dst, c.src, c.bytes);
  else
    std::memset(c.dst, 0, c.bytes);
}
// This thread's groups, oldest first; the last is the one being filled.
// (The emulation's threads are fibers of one OS thread: emu::fiber_local
// in tests/emulate/cuda_emu.hpp keeps a queue for each.)
inline std::deque<std::vector<Copy>>& groups() {
  auto& g = emu::fiber_local<std::deque<std::vector<Copy>>>();
  if (g.empty()) g.emplace_back();
  return g;
}
}  // namespace emu_async
#endif

// dst (shared) = the 16 bytes at src (global) when `in`, else zeros (src is
// not read). Both 16-byte aligned.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool in) {
#if defined(__CUDA_ARCH__)
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(in ? 16 : 0)
               : "memory");
#else
  const emu_async::Copy c{dst, in ? src : nullptr, 16};
  if (emu_async::early)
    emu_async::copy(c);
  else
    emu_async::groups().back().push_back(c);
#endif
}

// The same for 4 bytes (both 4-byte aligned).
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool in) {
#if defined(__CUDA_ARCH__)
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
               "r"(in ? 4 : 0)
               : "memory");
#else
  const emu_async::Copy c{dst, in ? src : nullptr, 4};
  if (emu_async::early)
    emu_async::copy(c);
  else
    emu_async::groups().back().push_back(c);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
  emu_async::groups().emplace_back();
#endif
}

// Waits until at most N of this thread's committed groups are in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#else
  auto& g = emu_async::groups();
  // g.back() is the open group; the committed ones are before it.
  while (g.size() - 1 > (size_t)N) {
    for (const auto& c : g.front()) emu_async::copy(c);
    g.pop_front();
  }
#endif
}
