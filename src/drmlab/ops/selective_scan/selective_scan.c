/*
 * Fused selective-scan kernels, the "c" backend of drmlab.ops.selective_scan (Mamba's S6
 * recurrence, Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces",
 * Algorithm 2).  Plain C99, built into its own shared object by drmlab/ops/ckernels.py and bound
 * through ctypes in drmlab/ops/selective_scan/c.py.
 *
 *   h_t[n, e] = exp(dt_t[e] A[n, e]) h_{t-1}[n, e] + (dt_t[e] x_t[e]) B_t[n]
 *   y_t[e]    = sum_n h_t[n, e] C_t[n]                      (n summed in order 0 .. N-1)
 *
 * The state [N, E] of one sequence never goes to memory as a [T, N, E] tensor: the forward keeps
 * it in a running buffer and writes only y, the last state and (for the backward) the state that
 * enters every segment of K steps.  The backward walks the segments from the last one, recomputes
 * a segment's states and decays into a [K, N, E] workspace and runs the adjoint recurrence
 *
 *   g_t = dh_t + dy_t C_t + exp(dt_{t+1} A) g_{t+1}           (g = dL/dh_t, dh_{T-1} = dh_last)
 *   dC_t[n] = sum_e dy_t[e] h_t[n, e]      dB_t[n] = sum_e g_t[n, e] dt_t[e] x_t[e]
 *   d(dt x)_t[e] = sum_n g_t[n, e] B_t[n]  w = g_t h_{t-1} exp(dt_t A)
 *   dA[n, e] += w dt_t[e]                  d dt_t[e] += sum_n w A[n, e]
 *   dh0 = exp(dt_0 A) g_0
 *
 * Layouts (all contiguous): x, dt, y [Bt, T, E]; A [N, E] (transposed from Mamba's [E, N] so every
 * inner loop runs over contiguous channels e and vectorises); Bm, Cm [Bt, T, N]; h0, h_last
 * [Bt, N, E]; checkpoints [Bt, ceil(T / K), N, E].  A call handles the sequences [b0, b1); the
 * caller gives each thread its own dA accumulator and workspaces.
 *
 * float32 uses a branch-free exp (Cody-Waite range reduction and Cephes' degree-6 polynomial,
 * within 1.35 ulp of exp over [-87, 88], exactly 0 below -87.3) so the loops vectorise; float64 calls
 * libm's exp.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

typedef long long i64;

/* The kernel is built for the processor it runs on (-march=native, CKernel(native=True)): on an
 * AVX-512 Xeon that is 1.45x faster than the AVX2 build at MAMBA's small shape, with the same bits
 * (the partial sums are explicit, and -ffp-contract=off keeps every multiply and add apart).  Where the
 * compiler refuses -march=native, the portable build keeps, on x86-64 with GCC, an AVX2 clone of every
 * kernel next to the baseline one, chosen at load time (ifunc); other compilers build the baseline only. */
#if defined(__x86_64__) && defined(__GNUC__) && __GNUC__ >= 6 && !defined(__clang__) && defined(__linux__)
#define DRM_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DRM_CLONES
#endif

static inline float drm_expf(float x)
{
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding and subtracting it rounds to nearest */
    float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float k = (xc * log2e + magic) - magic;
    float r = (xc - k * ln2_hi) - k * ln2_lo;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = (p * (r * r) + r) + 1.0f;
    union { unsigned int u; float f; } scale;
    scale.u = (unsigned int)((int)k + 127) << 23;
    float v = p * scale.f;
    v = x < -87.3f ? 0.0f : v;
    return x > 88.7f ? HUGE_VALF : v;
}

static inline double drm_exp(double x) { return exp(x); }

#define LANES 8

/* One channel i of the adjoint step at time t, state n (partial sums in lane j). */
#define SSCAN_ADJOINT(T_, i, j)                                                                \
    do {                                                                                       \
        const T_ d_ = dtt[i];                                                                  \
        const T_ gv_ = gn[i] + dyt[i] * cn;             /* g_t = carried + dy_t C_t */         \
        accC[j] += dyt[i] * htn[i];                                                            \
        accB[j] += gv_ * (d_ * xt[i]);                                                         \
        dxt[i] += gv_ * bn;                             /* d(dt x) */                          \
        const T_ w_ = gv_ * hpn[i] * dcn[i];            /* g_t h_{t-1} exp(dt A) */            \
        dAn[i] += w_ * d_;                                                                     \
        ddtt[i] += w_ * An[i];                                                                 \
        gn[i] = gv_ * dcn[i];                           /* carried to t - 1 */                 \
    } while (0)

#define SSCAN_KERNELS(T_, SUF, EXP)                                                             \
DRM_CLONES void drm_sscan_fwd_##SUF(const T_ *restrict x, const T_ *restrict dt, const T_ *restrict At,  \
                         const T_ *restrict Bm, const T_ *restrict Cm, const T_ *restrict h0, \
                         T_ *restrict y, T_ *restrict hlast, T_ *restrict ck,                 \
                         i64 Bt, i64 T, i64 E, i64 N, i64 K, i64 b0, i64 b1)                  \
{                                                                                             \
    (void)Bt;                                                                                 \
    const i64 S = N * E, nseg = (T + K - 1) / K;                                              \
    for (i64 b = b0; b < b1; ++b) {                                                           \
        T_ *h = hlast + b * S;                                                                \
        if (h0) memcpy(h, h0 + b * S, (size_t)S * sizeof(T_));                                \
        else memset(h, 0, (size_t)S * sizeof(T_));                                            \
        for (i64 t = 0; t < T; ++t) {                                                         \
            if (ck && t % K == 0) memcpy(ck + (b * nseg + t / K) * S, h, (size_t)S * sizeof(T_)); \
            const T_ *xt = x + (b * T + t) * E, *dtt = dt + (b * T + t) * E;                  \
            const T_ *Bt_ = Bm + (b * T + t) * N, *Ct = Cm + (b * T + t) * N;                 \
            T_ *yt = y + (b * T + t) * E;                                                     \
            for (i64 e = 0; e < E; ++e) yt[e] = 0;                                            \
            for (i64 n = 0; n < N; ++n) {                                                     \
                const T_ bn = Bt_[n], cn = Ct[n];                                             \
                const T_ *An = At + n * E;                                                    \
                T_ *hn = h + n * E;                                                           \
                for (i64 e = 0; e < E; ++e) {                                                 \
                    T_ d = dtt[e];                                                            \
                    T_ hv = EXP(d * An[e]) * hn[e] + (d * xt[e]) * bn;                        \
                    hn[e] = hv;                                                               \
                    yt[e] += hv * cn;                                                         \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
}                                                                                             \
                                                                                              \
DRM_CLONES void drm_sscan_bwd_##SUF(const T_ *restrict x, const T_ *restrict dt, const T_ *restrict At,  \
                         const T_ *restrict Bm, const T_ *restrict Cm,                        \
                         const T_ *restrict ck, const T_ *restrict dy,                        \
                         const T_ *restrict dhlast,                                           \
                         T_ *restrict dx, T_ *restrict ddt, T_ *restrict dA,                  \
                         T_ *restrict dB, T_ *restrict dC, T_ *restrict dh0,                  \
                         T_ *restrict states, T_ *restrict decays, T_ *restrict g,            \
                         i64 Bt, i64 T, i64 E, i64 N, i64 K, i64 b0, i64 b1)                  \
{                                                                                             \
    (void)Bt;                                                                                 \
    const i64 S = N * E, nseg = (T + K - 1) / K;                                              \
    for (i64 b = b0; b < b1; ++b) {                                                           \
        if (dhlast) memcpy(g, dhlast + b * S, (size_t)S * sizeof(T_));                        \
        else memset(g, 0, (size_t)S * sizeof(T_));                                            \
        for (i64 s = nseg - 1; s >= 0; --s) {                                                 \
            const i64 t0 = s * K, t1 = (t0 + K < T) ? t0 + K : T;                             \
            const T_ *hin = ck + (b * nseg + s) * S;                                          \
            /* recompute the segment's states and decays */                                   \
            for (i64 t = t0; t < t1; ++t) {                                                   \
                const T_ *xt = x + (b * T + t) * E, *dtt = dt + (b * T + t) * E;              \
                const T_ *Bt_ = Bm + (b * T + t) * N;                                         \
                const T_ *hp = (t == t0) ? hin : states + (t - 1 - t0) * S;                   \
                T_ *ht = states + (t - t0) * S, *dc = decays + (t - t0) * S;                  \
                for (i64 n = 0; n < N; ++n) {                                                 \
                    const T_ bn = Bt_[n];                                                     \
                    const T_ *An = At + n * E;                                                \
                    for (i64 e = 0; e < E; ++e) {                                             \
                        T_ d = dtt[e];                                                        \
                        T_ a = EXP(d * An[e]);                                                \
                        dc[n * E + e] = a;                                                    \
                        ht[n * E + e] = a * hp[n * E + e] + (d * xt[e]) * bn;                 \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
            /* the adjoint recurrence, backwards through the segment */                       \
            for (i64 t = t1 - 1; t >= t0; --t) {                                              \
                const T_ *xt = x + (b * T + t) * E, *dtt = dt + (b * T + t) * E;              \
                const T_ *Bt_ = Bm + (b * T + t) * N, *Ct = Cm + (b * T + t) * N;             \
                const T_ *dyt = dy + (b * T + t) * E;                                         \
                const T_ *hp = (t == t0) ? hin : states + (t - 1 - t0) * S;                   \
                const T_ *ht = states + (t - t0) * S, *dc = decays + (t - t0) * S;            \
                T_ *dxt = dx + (b * T + t) * E, *ddtt = ddt + (b * T + t) * E;                \
                for (i64 e = 0; e < E; ++e) { dxt[e] = 0; ddtt[e] = 0; }                      \
                for (i64 n = 0; n < N; ++n) {                                                 \
                    const T_ bn = Bt_[n], cn = Ct[n];                                         \
                    const T_ *An = At + n * E, *hpn = hp + n * E, *htn = ht + n * E;          \
                    const T_ *dcn = dc + n * E;                                               \
                    T_ *gn = g + n * E, *dAn = dA + n * E;                                    \
                    T_ accC[LANES] = {0}, accB[LANES] = {0};                                  \
                    i64 e = 0;                                                                \
                    /* LANES independent partial sums for dC and dB, so the loop vectorises */ \
                    for (; e + LANES <= E; e += LANES)                                        \
                        for (int j = 0; j < LANES; ++j) SSCAN_ADJOINT(T_, e + j, j);          \
                    for (; e < E; ++e) SSCAN_ADJOINT(T_, e, 0);                               \
                    T_ sc = 0, sb = 0;                                                        \
                    for (int j = 0; j < LANES; ++j) { sc += accC[j]; sb += accB[j]; }         \
                    dC[(b * T + t) * N + n] = sc;                                             \
                    dB[(b * T + t) * N + n] = sb;                                             \
                }                                                                             \
                /* dxt holds d(dt x); split it into dx and d dt */                            \
                for (i64 e = 0; e < E; ++e) {                                                 \
                    T_ v = dxt[e];                                                            \
                    ddtt[e] += v * xt[e];                                                     \
                    dxt[e] = v * dtt[e];                                                      \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        if (dh0) memcpy(dh0 + b * S, g, (size_t)S * sizeof(T_));                              \
    }                                                                                         \
}

SSCAN_KERNELS(float, f32, drm_expf)
SSCAN_KERNELS(double, f64, drm_exp)

/* The float32 exp on its own, for the tests. */
DRM_CLONES void drm_expf_array(const float *restrict x, float *restrict out, i64 n)
{
    for (i64 i = 0; i < n; ++i) out[i] = drm_expf(x[i]);
}
