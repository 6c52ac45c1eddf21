/*
 * First-order linear scan kernels, the "c" backend of drmlab.ops.linear_scan (no torch headers:
 * plain C99, built on first use with `cc -O3 -shared -fPIC` by drmlab/ops/ckernels.py and bound
 * through ctypes in drmlab/ops/linear_scan/c.py).
 *
 *   forward   m_t = f_t * m_{t-1} + u_t,              m_{-1} = init (or 0 when init is NULL)
 *   backward  g_t = dm_t + conj(f_{t+1}) * g_{t+1},   g_T = 0
 *             du_t = g_t,  df_t = g_t * conj(m_{t-1}),  dinit = conj(f_0) * g_0
 *
 * All buffers are contiguous [B, T, D] (init / dinit: [B, D]).  Each call handles the batch
 * rows [b0, b1) and the channel columns [d0, d1), so the caller can split the work between
 * threads without overlap.  The inner loop runs over contiguous channels and vectorises.
 * Complex buffers are interleaved (re, im) pairs; D and the column range count complex
 * elements.  The arithmetic is written out by hand (no C99 _Complex), so there is no
 * libgcc NaN fix-up call and the result matches a plain float loop operation for operation.
 * No division, no logarithm: a zero gate cuts the past exactly.
 */
#include <stddef.h>

typedef long long i64;

#define REAL_KERNELS(T_, SUF)                                                               \
void drm_scan_fwd_##SUF(const T_ *restrict f, const T_ *restrict u, const T_ *restrict init, \
                        T_ *restrict out, i64 B, i64 T, i64 D,                              \
                        i64 b0, i64 b1, i64 d0, i64 d1)                                     \
{                                                                                           \
    (void)B;                                                                                \
    for (i64 b = b0; b < b1; ++b) {                                                         \
        const T_ *fb = f + b * T * D;                                                       \
        const T_ *ub = u + b * T * D;                                                       \
        T_ *ob = out + b * T * D;                                                           \
        if (T <= 0) continue;                                                               \
        if (init) {                                                                         \
            const T_ *ib = init + b * D;                                                    \
            for (i64 d = d0; d < d1; ++d) ob[d] = fb[d] * ib[d] + ub[d];                    \
        } else {                                                                            \
            for (i64 d = d0; d < d1; ++d) ob[d] = ub[d];                                    \
        }                                                                                   \
        for (i64 t = 1; t < T; ++t) {                                                       \
            const T_ *ft = fb + t * D;                                                      \
            const T_ *ut = ub + t * D;                                                      \
            const T_ *op = ob + (t - 1) * D;                                                \
            T_ *ot = ob + t * D;                                                            \
            for (i64 d = d0; d < d1; ++d) ot[d] = ft[d] * op[d] + ut[d];                    \
        }                                                                                   \
    }                                                                                       \
}                                                                                           \
                                                                                            \
void drm_scan_bwd_##SUF(const T_ *restrict f, const T_ *restrict m, const T_ *restrict init, \
                        const T_ *restrict dm, T_ *restrict du, T_ *restrict df,            \
                        T_ *restrict dinit, i64 B, i64 T, i64 D,                            \
                        i64 b0, i64 b1, i64 d0, i64 d1)                                     \
{                                                                                           \
    (void)B;                                                                                \
    for (i64 b = b0; b < b1; ++b) {                                                         \
        const T_ *fb = f + b * T * D;                                                       \
        const T_ *mb = m + b * T * D;                                                       \
        const T_ *gb = dm + b * T * D;                                                      \
        T_ *ub = du + b * T * D;                                                            \
        T_ *dfb = df ? df + b * T * D : NULL;                                               \
        if (T <= 0) {                                                                       \
            if (dinit) for (i64 d = d0; d < d1; ++d) dinit[b * D + d] = 0;                  \
            continue;                                                                       \
        }                                                                                   \
        {                                                                                   \
            const T_ *gt = gb + (T - 1) * D;                                                \
            T_ *ut = ub + (T - 1) * D;                                                      \
            for (i64 d = d0; d < d1; ++d) ut[d] = gt[d];                                    \
        }                                                                                   \
        /* fused: g_t from g_{t+1}, then df_{t+1} = g_{t+1} m_t while both are hot */       \
        for (i64 t = T - 2; t >= 0; --t) {                                                  \
            const T_ *fn = fb + (t + 1) * D;                                                \
            const T_ *gt = gb + t * D;                                                      \
            const T_ *un = ub + (t + 1) * D;                                                \
            const T_ *mt = mb + t * D;                                                      \
            T_ *ut = ub + t * D;                                                            \
            if (dfb) {                                                                      \
                T_ *fo = dfb + (t + 1) * D;                                                 \
                for (i64 d = d0; d < d1; ++d) {                                             \
                    T_ x = un[d];                                                           \
                    fo[d] = x * mt[d];                                                      \
                    ut[d] = gt[d] + fn[d] * x;                                              \
                }                                                                           \
            } else {                                                                        \
                for (i64 d = d0; d < d1; ++d) ut[d] = gt[d] + fn[d] * un[d];                \
            }                                                                               \
        }                                                                                   \
        if (dfb) {                                                                          \
            if (init) {                                                                     \
                const T_ *ib = init + b * D;                                                \
                for (i64 d = d0; d < d1; ++d) dfb[d] = ub[d] * ib[d];                       \
            } else {                                                                        \
                for (i64 d = d0; d < d1; ++d) dfb[d] = 0;                                   \
            }                                                                               \
        }                                                                                   \
        if (dinit) {                                                                        \
            T_ *ib = dinit + b * D;                                                         \
            for (i64 d = d0; d < d1; ++d) ib[d] = fb[d] * ub[d];                            \
        }                                                                                   \
    }                                                                                       \
}

REAL_KERNELS(float, f32)
REAL_KERNELS(double, f64)

/* Complex: element d occupies [2d] (re) and [2d+1] (im). */
#define CPLX_KERNELS(T_, SUF)                                                               \
void drm_scan_fwd_##SUF(const T_ *restrict f, const T_ *restrict u, const T_ *restrict init, \
                        T_ *restrict out, i64 B, i64 T, i64 D,                              \
                        i64 b0, i64 b1, i64 d0, i64 d1)                                     \
{                                                                                           \
    const i64 S = 2 * D;                                                                    \
    (void)B;                                                                                \
    for (i64 b = b0; b < b1; ++b) {                                                         \
        const T_ *fb = f + b * T * S;                                                       \
        const T_ *ub = u + b * T * S;                                                       \
        T_ *ob = out + b * T * S;                                                           \
        if (T <= 0) continue;                                                               \
        if (init) {                                                                         \
            const T_ *ib = init + b * S;                                                    \
            for (i64 d = d0; d < d1; ++d) {                                                 \
                T_ fr = fb[2*d], fi = fb[2*d+1], mr = ib[2*d], mi = ib[2*d+1];              \
                ob[2*d]   = (fr * mr - fi * mi) + ub[2*d];                                  \
                ob[2*d+1] = (fr * mi + fi * mr) + ub[2*d+1];                                \
            }                                                                               \
        } else {                                                                            \
            for (i64 d = d0; d < d1; ++d) { ob[2*d] = ub[2*d]; ob[2*d+1] = ub[2*d+1]; }     \
        }                                                                                   \
        for (i64 t = 1; t < T; ++t) {                                                       \
            const T_ *ft = fb + t * S;                                                      \
            const T_ *ut = ub + t * S;                                                      \
            const T_ *op = ob + (t - 1) * S;                                                \
            T_ *ot = ob + t * S;                                                            \
            for (i64 d = d0; d < d1; ++d) {                                                 \
                T_ fr = ft[2*d], fi = ft[2*d+1], mr = op[2*d], mi = op[2*d+1];              \
                ot[2*d]   = (fr * mr - fi * mi) + ut[2*d];                                  \
                ot[2*d+1] = (fr * mi + fi * mr) + ut[2*d+1];                                \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
}                                                                                           \
                                                                                            \
void drm_scan_bwd_##SUF(const T_ *restrict f, const T_ *restrict m, const T_ *restrict init, \
                        const T_ *restrict dm, T_ *restrict du, T_ *restrict df,            \
                        T_ *restrict dinit, i64 B, i64 T, i64 D,                            \
                        i64 b0, i64 b1, i64 d0, i64 d1)                                     \
{                                                                                           \
    const i64 S = 2 * D;                                                                    \
    (void)B;                                                                                \
    for (i64 b = b0; b < b1; ++b) {                                                         \
        const T_ *fb = f + b * T * S;                                                       \
        const T_ *mb = m + b * T * S;                                                       \
        const T_ *gb = dm + b * T * S;                                                      \
        T_ *ub = du + b * T * S;                                                            \
        T_ *dfb = df ? df + b * T * S : NULL;                                               \
        if (T <= 0) {                                                                       \
            if (dinit) for (i64 d = 2*d0; d < 2*d1; ++d) dinit[b * S + d] = 0;              \
            continue;                                                                       \
        }                                                                                   \
        {                                                                                   \
            const T_ *gt = gb + (T - 1) * S;                                                \
            T_ *ut = ub + (T - 1) * S;                                                      \
            for (i64 d = 2*d0; d < 2*d1; ++d) ut[d] = gt[d];                                \
        }                                                                                   \
        /* g_t = dm_t + conj(f_{t+1}) g_{t+1};  df_{t+1} = g_{t+1} conj(m_t) (fused) */    \
        for (i64 t = T - 2; t >= 0; --t) {                                                  \
            const T_ *fn = fb + (t + 1) * S;                                                \
            const T_ *gt = gb + t * S;                                                      \
            const T_ *un = ub + (t + 1) * S;                                                \
            const T_ *mt = mb + t * S;                                                      \
            T_ *ut = ub + t * S;                                                            \
            if (dfb) {                                                                      \
                T_ *fo = dfb + (t + 1) * S;                                                 \
                for (i64 d = d0; d < d1; ++d) {                                             \
                    T_ fr = fn[2*d], fi = fn[2*d+1], xr = un[2*d], xi = un[2*d+1];          \
                    T_ mr = mt[2*d], mi = mt[2*d+1];                                        \
                    fo[2*d]   = xr * mr + xi * mi;                                          \
                    fo[2*d+1] = xi * mr - xr * mi;                                          \
                    ut[2*d]   = gt[2*d]   + (fr * xr + fi * xi);                            \
                    ut[2*d+1] = gt[2*d+1] + (fr * xi - fi * xr);                            \
                }                                                                           \
            } else {                                                                        \
                for (i64 d = d0; d < d1; ++d) {                                             \
                    T_ fr = fn[2*d], fi = fn[2*d+1], xr = un[2*d], xi = un[2*d+1];          \
                    ut[2*d]   = gt[2*d]   + (fr * xr + fi * xi);                            \
                    ut[2*d+1] = gt[2*d+1] + (fr * xi - fi * xr);                            \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        /* df_0 = g_0 conj(init) */                                                         \
        if (dfb) {                                                                          \
            if (init) {                                                                     \
                const T_ *ib = init + b * S;                                                \
                for (i64 d = d0; d < d1; ++d) {                                             \
                    T_ gr = ub[2*d], gi = ub[2*d+1], mr = ib[2*d], mi = ib[2*d+1];          \
                    dfb[2*d]   = gr * mr + gi * mi;                                         \
                    dfb[2*d+1] = gi * mr - gr * mi;                                         \
                }                                                                           \
            } else {                                                                        \
                for (i64 d = 2*d0; d < 2*d1; ++d) dfb[d] = 0;                               \
            }                                                                               \
        }                                                                                   \
        /* dinit = conj(f_0) g_0 */                                                         \
        if (dinit) {                                                                        \
            T_ *ib = dinit + b * S;                                                         \
            for (i64 d = d0; d < d1; ++d) {                                                 \
                T_ fr = fb[2*d], fi = fb[2*d+1], xr = ub[2*d], xi = ub[2*d+1];              \
                ib[2*d]   = fr * xr + fi * xi;                                              \
                ib[2*d+1] = fr * xi - fi * xr;                                              \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
}

CPLX_KERNELS(float, c64)
CPLX_KERNELS(double, c128)

/* ABI version, checked by drmlab/ops/linear_scan/c.py when it binds the kernels. */
int drm_scan_abi_version(void) { return 2; }
