/* The bound operator of docs/drm.md sections 6 and A.3.8, fused: forward and backward in one pass
 * over each state vector (row) of a contiguous [rows, d] buffer.
 *
 *   n = |y|,  nc = max(n, 1e-8),  c = min(R / nc, 1),  w = c y,  out = R tanh(w / R)
 *
 * backward, for the output gradient g (t = out / R):
 *
 *   gw = g (1 - t^2)
 *   dy = c gw - [R / nc <= 1 and n >= 1e-8] (R / nc^2) (y . gw) y / n
 *
 * (the indicator is where torch's clamp passes the gradient of R / nc, so the gradient agrees with
 * autograd's through the plain operations also on the boundary |y| = R).  Norms and dot products are
 * accumulated in double.  The float32 tanh is a rational minimax approximation (the one Eigen and XLA
 * use for float32 tanh, a few ulp in [-7.9, 7.9], +-1 beyond); float64 uses libm's tanh.
 * Plain C99, no torch headers: built and loaded by drmlab.ops.ckernels. */
#include <math.h>
#include <stddef.h>

#define ABI_VERSION 1
#define NORM_FLOOR 1e-8

int drm_bound_abi_version(void) { return ABI_VERSION; }

static inline float tanh_f32(float x) {
    const float clamp = 7.90531110763549805f;
    float xc = x > clamp ? clamp : (x < -clamp ? -clamp : x);
    float x2 = xc * xc;
    float p = -2.76076847742355e-16f;
    p = p * x2 + 2.00018790482477e-13f;
    p = p * x2 + -8.60467152213735e-11f;
    p = p * x2 + 5.12229709037114e-08f;
    p = p * x2 + 1.48572235717979e-05f;
    p = p * x2 + 6.37261928875436e-04f;
    p = p * x2 + 4.89352455891786e-03f;
    p = p * xc;
    float q = 1.19825839466702e-06f;
    q = q * x2 + 1.18534705686654e-04f;
    q = q * x2 + 2.26843463243900e-03f;
    q = q * x2 + 4.89352518554385e-03f;
    float r = p / q;
    return fabsf(x) < 0.0004f ? x : r;
}

static inline double tanh_f64(double x) { return tanh(x); }

/* sum_j a_j b_j over 16 independent lanes (so that the compiler vectorizes it without reassociating a
 * single sum), the lanes and the tail added in double */
#define LANES 16
#define DOT(SUFFIX, T)                                                                                  \
    static inline double dot_##SUFFIX(const T *restrict a, const T *restrict b, long long d) {          \
        T acc[LANES] = {0};                                                                             \
        long long j = 0;                                                                                \
        for (; j + LANES <= d; j += LANES)                                                              \
            for (int k = 0; k < LANES; ++k) acc[k] += a[j + k] * b[j + k];                              \
        double total = 0.0;                                                                             \
        for (int k = 0; k < LANES; ++k) total += (double)acc[k];                                        \
        for (; j < d; ++j) total += (double)a[j] * (double)b[j];                                        \
        return total;                                                                                   \
    }
DOT(f32, float)
DOT(f64, double)

/* y = z (+ x where x is not NULL); writes out, and y where y_out is not NULL (the backward reads it),
 * and each row's norm n. */
#define BOUND_FWD(SUFFIX, T, TANH)                                                                      \
    void drm_bound_fwd_##SUFFIX(const T *restrict z, const T *restrict x, T *restrict y_out,     \
                                T *restrict out, T *restrict norms, double radius,      \
                                long long d, long long r0, long long r1) {                              \
        for (long long r = r0; r < r1; ++r) {                                                           \
            const T *zr = z + r * d;                                                                    \
            const T *xr = x ? x + r * d : NULL;                                                         \
            T *o = out + r * d;                                                                         \
            double sq = 0.0;                                                                            \
            if (xr) {                                                                                   \
                for (long long j = 0; j < d; ++j) o[j] = zr[j] + xr[j];                                 \
                if (y_out)                                                                              \
                    for (long long j = 0; j < d; ++j) y_out[r * d + j] = o[j];                          \
            } else {                                                                                    \
                for (long long j = 0; j < d; ++j) o[j] = zr[j];                                         \
            }                                                                                           \
            sq = dot_##SUFFIX(o, o, d);                                                                  \
            double n = sqrt(sq);                                                                        \
            double nc = n > NORM_FLOOR ? n : NORM_FLOOR;                                                \
            double c = radius / nc < 1.0 ? radius / nc : 1.0;                                           \
            T scale = (T)(c / radius), rad = (T)radius;                                                 \
            for (long long j = 0; j < d; ++j) o[j] = rad * TANH(o[j] * scale);                          \
            norms[r] = (T)n;                                                                            \
        }                                                                                               \
    }

#define BOUND_BWD(SUFFIX, T)                                                                            \
    void drm_bound_bwd_##SUFFIX(const T *restrict g, const T *restrict y, const T *restrict out,  \
                                const T *restrict norms, T *restrict dy,            \
                                double radius, long long d, long long r0, long long r1) {               \
        for (long long r = r0; r < r1; ++r) {                                                           \
            const T *gr = g + r * d, *yr = y + r * d, *o = out + r * d;                                 \
            T *dr = dy + r * d;                                                                         \
            T inv = (T)(1.0 / radius);                                                                  \
            for (long long j = 0; j < d; ++j) {                                                         \
                T t = o[j] * inv;                                                                       \
                dr[j] = gr[j] * ((T)1 - t * t);                                                         \
            }                                                                                           \
            double dot = dot_##SUFFIX(yr, dr, d);                                                       \
            double n = (double)norms[r];                                                                \
            double nc = n > NORM_FLOOR ? n : NORM_FLOOR;                                                \
            double q = radius / nc;                                                                     \
            T c = (T)(q < 1.0 ? q : 1.0);                                                               \
            T k = (q <= 1.0 && n >= NORM_FLOOR) ? (T)(radius / (nc * nc) * dot / n) : (T)0;             \
            for (long long j = 0; j < d; ++j) dr[j] = c * dr[j] - k * yr[j];                            \
        }                                                                                               \
    }

BOUND_FWD(f32, float, tanh_f32)
BOUND_FWD(f64, double, tanh_f64)
BOUND_BWD(f32, float)
BOUND_BWD(f64, double)
