// CPU stand-in for CUDA's half type (see ../cuda_emu.hpp).
#pragma once
struct __half {
  _Float16 v;
};
inline float __half2float(__half x) { return (float)x.v; }
inline __half __float2half_rn(float x) { return {(_Float16)x}; }
