// Dequantization: rows of a quantized matrix as fp32, for products with many rows of x (prefill),
// where the library's fp32 GEMM beats one pass of the kernel per 4 activation rows
// (cpu_kernels.h: dequantize_rows; the op dequantize in cpu_qgemv.cpp runs it on torch's threads).
//
// Contract: dequantize_rows(q, int4, s, z, K, ng, n0, n1, w) writes rows [n0, n1) of w (N, K):
// int8 w[n, k] = q[n, k] * s[n]; int4 w[n, k] = nibble k of row n * s[n, k / g] + z[n, k / g]
// (g = K / ng; the low nibble of byte j is element 2j, the high one 2j + 1); s and z fp32.
#include <cstdint>

#include "cpu_kernels.h"

namespace tinyllm_cpu {

void dequantize_rows(const void* q, bool int4, const float* sp, const float* zp, int64_t K, int64_t ng, int64_t n0,
                     int64_t n1, float* wp) {
  const int64_t g = K / ng;
  for (int64_t n = n0; n < n1; ++n) {
    float* row = wp + n * K;
    if (!int4) {
      const int8_t* qr = static_cast<const int8_t*>(q) + n * K;
      for (int64_t k = 0; k < K; ++k) row[k] = float(qr[k]) * sp[n];
      continue;
    }
    const uint8_t* qr = static_cast<const uint8_t*>(q) + n * (K / 2);
    for (int64_t k = 0; k < K; k += 2) {
      const float sc = sp[n * ng + k / g], zr = zp[n * ng + k / g];
      row[k] = float(qr[k / 2] & 15) * sc + zr;
      row[k + 1] = float(qr[k / 2] >> 4) * sc + zr;
    }
  }
}

}  // namespace tinyllm_cpu
