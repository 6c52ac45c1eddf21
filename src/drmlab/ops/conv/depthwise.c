/* The causal depthwise convolution of docs/drm.md section 7, forward and backward in one pass each, over
 * channel ranges [c0, c1) of contiguous [B, T, C] buffers (time-major, channels last) and taps [K, C]:
 *
 *   y[b, t, c]  = sum_j w[j, c] x[b, t - (K-1-j) dil, c]  (+ bias[c]),   x = 0 at negative times
 *   dx[b, t, c] = sum_j w[j, c] g[b, t + (K-1-j) dil, c]               (g = 0 past the end)
 *   dw[j, c]    = sum_{b, t} g[b, t, c] x[b, t - (K-1-j) dil, c],       dbias[c] = sum_{b, t} g[b, t, c]
 *
 * The forward adds the taps in the reference's order (first tap first, the bias last); the weight and
 * bias gradients accumulate in double. Plain C99, no torch headers: built and loaded by drmlab.ops.ckernels. */
#include <stdlib.h>

#define ABI_VERSION 1

int drm_dwconv_abi_version(void) { return ABI_VERSION; }

#define DWCONV(SUFFIX, T)                                                                               \
    void drm_dwconv_fwd_##SUFFIX(const T *restrict x, const T *restrict w, const T *restrict bias,      \
                                 T *restrict y, long long B, long long TT, long long C, long long K,    \
                                 long long dil, long long c0, long long c1) {                           \
        for (long long b = 0; b < B; ++b)                                                               \
            for (long long t = 0; t < TT; ++t) {                                                        \
                T *yr = y + (b * TT + t) * C;                                                           \
                for (long long c = c0; c < c1; ++c) yr[c] = (T)0;                                       \
                for (long long j = 0; j < K; ++j) {                                                     \
                    long long s = t - (K - 1 - j) * dil;                                                \
                    if (s < 0) continue;                                                                \
                    const T *xr = x + (b * TT + s) * C, *wj = w + j * C;                                \
                    for (long long c = c0; c < c1; ++c) yr[c] += wj[c] * xr[c];                         \
                }                                                                                       \
                if (bias)                                                                               \
                    for (long long c = c0; c < c1; ++c) yr[c] += bias[c];                               \
            }                                                                                           \
    }                                                                                                   \
                                                                                                        \
    /* returns 0, or -1 where the scratch for the weight gradient could not be allocated */            \
    int drm_dwconv_bwd_##SUFFIX(const T *restrict g, const T *restrict x, const T *restrict w,          \
                                T *restrict dx, T *restrict dw, T *restrict dbias, long long B,         \
                                long long TT, long long C, long long K, long long dil, long long c0,    \
                                long long c1) {                                                         \
        long long n = c1 - c0;                                                                          \
        if (dx)                                                                                         \
            for (long long b = 0; b < B; ++b)                                                           \
                for (long long t = 0; t < TT; ++t) {                                                    \
                    T *dr = dx + (b * TT + t) * C;                                                      \
                    for (long long c = c0; c < c1; ++c) dr[c] = (T)0;                                   \
                    for (long long j = K - 1; j >= 0; --j) {                                            \
                        long long s = t + (K - 1 - j) * dil;                                            \
                        if (s >= TT) continue;                                                          \
                        const T *gr = g + (b * TT + s) * C, *wj = w + j * C;                            \
                        for (long long c = c0; c < c1; ++c) dr[c] += wj[c] * gr[c];                     \
                    }                                                                                   \
                }                                                                                       \
        if (dw || dbias) {                                                                              \
            double *acc = calloc((size_t)((K + 1) * n), sizeof(double));                                \
            if (!acc) return -1;                                                                        \
            for (long long b = 0; b < B; ++b)                                                           \
                for (long long t = 0; t < TT; ++t) {                                                    \
                    const T *gr = g + (b * TT + t) * C;                                                 \
                    double *ab = acc + K * n;                                                           \
                    for (long long c = 0; c < n; ++c) ab[c] += (double)gr[c0 + c];                      \
                    for (long long j = 0; j < K; ++j) {                                                 \
                        long long s = t - (K - 1 - j) * dil;                                            \
                        if (s < 0) continue;                                                            \
                        const T *xr = x + (b * TT + s) * C;                                             \
                        double *aj = acc + j * n;                                                       \
                        for (long long c = 0; c < n; ++c) aj[c] += (double)gr[c0 + c] * (double)xr[c0 + c]; \
                    }                                                                                   \
                }                                                                                       \
            if (dw)                                                                                     \
                for (long long j = 0; j < K; ++j)                                                       \
                    for (long long c = 0; c < n; ++c) dw[j * C + c0 + c] = (T)acc[j * n + c];           \
            if (dbias)                                                                                  \
                for (long long c = 0; c < n; ++c) dbias[c0 + c] = (T)acc[K * n + c];                    \
            free(acc);                                                                                  \
        }                                                                                               \
        return 0;                                                                                       \
    }

DWCONV(f32, float)
DWCONV(f64, double)
