/*
 * The fused DRM decode step (docs/drm.md section A.4.5, "The fused step"): one C call for one token of
 * the block path inside an open block (geometry and prefix with the block's step constants, causal mixer,
 * token residual, selective memory) and the emitter; plain C99, no torch headers, built on first use by
 * drmlab/ops/ckernels.py and bound through ctypes in drmlab/ops/decode_step/c.py (which names every slot
 * below; the two lists must stay in one order, checked by drm_decode_abi).
 *
 * Per batch row b, with e = E[token_b] and z_s the block start (anchor):
 *   prefix  c = tanh(W2 gelu(W1_z z_s + W1_e e + b1) + b2)            (W1_z z_s given: the state part)
 *           v = (c * a) V (directions) or c (direct transition)
 *           v <- (1 - s) v + s (G + lambda I)^-1 v, by Woodbury with the given factors (when naturalized)
 *           delta = B(z_s + dt v) - z_s,  S <- S + delta,  z = B(z_s + S)
 *   mixer   h = silu(W_in [z; z - z_prev; delta; e; dimD; rho] + b);
 *           per layer h <- h + PW(silu(DWConv(window, h)));  z = B(z + eta_mix (W_out h + b_out))
 *   token   z = B(z + eta_tok W_tok e)
 *   memory  h = silu(W_h [z_mem_prev; e] + b); m = sigmoid(W_f h + b_f + fb) m_prev
 *               + sigmoid(W_w h + b_w) tanh(W_c h + b_c);  z = B(z + eta_m m)
 *   emitter logits = W_o gelu(W_e RMSNorm(z) + b_e) + b_o
 * with B(z) = R tanh(z min(1, R / max(|z|, 1e-8)) / R). The same maths as the stages' fast steps; the
 * sums run in another order (several partial sums per dot product), so the results agree to round-off.
 * Every buffer is contiguous; each matrix is an nn.Linear weight transposed, [in, out] (its column blocks
 * are row blocks here; the embedding and the depthwise taps keep their own layouts). The caller's state buffers are read only; every new value goes to *_OUT.
 */
#ifndef DRM_DECODE_BODY
#define DRM_DECODE_BODY 1

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef long long i64;

#define DRM_DECODE_ABI 1

/* pointer slots */
enum {
    P_TOKENS, P_EMBEDDING,
    P_FLOW_W1, P_FLOW_B1, P_FLOW_W2, P_FLOW_B2,
    P_STATE_PART, P_GATES, P_DIRECTIONS, P_DAMPED, P_U, P_SCALED, P_CHOL, P_RHO, P_DIM_D,
    P_Z_START, P_DELTA_SUM, P_DELTA_SUM_OUT,
    P_MIX_W, P_MIX_B, P_MIX_PREVIOUS, P_MIX_OUT_W, P_MIX_OUT_B, P_MIX_PREVIOUS_OUT,
    P_RES_W,
    P_MEM_W, P_MEM_B, P_MEM_FW, P_MEM_FB, P_MEM_WW, P_MEM_WB, P_MEM_CW, P_MEM_CB,
    P_MEM_PREVIOUS, P_MEM_M, P_MEM_PREVIOUS_OUT, P_MEM_M_OUT,
    P_NORM_W, P_EMIT_W1, P_EMIT_B1, P_EMIT_W2, P_EMIT_B2,
    P_Z_OUT, P_LOGITS,
    P_LAYERS /* then per mixer layer: conv weight [M, K], conv bias, pointwise W, pointwise b, context, context out */
};
#define P_PER_LAYER 6

/* integer slots */
enum {
    I_BATCH, I_STATE, I_TOKEN, I_VOCAB, I_FLOW_HIDDEN, I_FLOW_OUT, I_DIRECTIONS, I_RANK,
    I_MIX_HIDDEN, I_MIX_LAYERS, I_KERNEL, I_MEM_HIDDEN, I_EMIT_HIDDEN,
    I_HAS_PREFIX, I_HAS_MIXER, I_HAS_RESIDUAL, I_HAS_MEMORY, I_BOUNDED,
    I_DILATIONS /* then one per mixer layer */
};

/* real slots (double, converted to the compute type) */
enum { R_DT, R_STRENGTH, R_RADIUS, R_MIX_SCALE, R_RES_SCALE, R_MEM_SCALE, R_FORGET_BIAS, R_NORM_EPS, R_COUNT };

int drm_decode_abi(void) { return DRM_DECODE_ABI; }
int drm_decode_pointer_slots(void) { return P_LAYERS; }
int drm_decode_integer_slots(void) { return I_DILATIONS; }
int drm_decode_real_slots(void) { return R_COUNT; }

#define T float
#define SUF(name) name##_f32
#define TANH tanhf
#define ERF erff
#define EXP expf
#define SQRT sqrtf
#include "step.c" /* this file again, as the body (the else branch) */
#undef T
#undef SUF
#undef TANH
#undef ERF
#undef EXP
#undef SQRT

#define T double
#define SUF(name) name##_f64
#define TANH tanh
#define ERF erf
#define EXP exp
#define SQRT sqrt
#include "step.c" /* this file again, as the body (the else branch) */

#else /* ------------------------------------------------------------------ the body, once per dtype */

/* y[b, o] = (y[b, o] if accumulate) + bias[o] + sum_k x[b, k] WT[k, o] for b < B, o < out, k < in (k in
 * order), over the weight transposed (WT [in, ldw], its first ``out`` columns): each row in tiles of 32
 * outputs whose sums stay in registers; the loops over outputs vectorise (without reassociation). */
static void SUF(linear)(i64 B, i64 in, i64 out, const T *restrict x, i64 ldx, const T *restrict WT, i64 ldw,
                        const T *restrict bias, T *restrict y, i64 ldy, int accumulate)
{
    enum { SINGLE = 32 };
    i64 b = 0;
    for (; b < B; ++b) {
        const T *xb = x + b * ldx;
        T *yb = y + b * ldy;
        i64 o = 0;
        for (; o + SINGLE <= out; o += SINGLE) {
            T acc[SINGLE] = {0};
            for (i64 k = 0; k < in; ++k) {
                const T *w = WT + k * ldw + o;
                T xk = xb[k];
                for (int j = 0; j < SINGLE; ++j) acc[j] += xk * w[j];
            }
            for (int j = 0; j < SINGLE; ++j) {
                T v = acc[j] + (bias ? bias[o + j] : 0);
                yb[o + j] = accumulate ? yb[o + j] + v : v;
            }
        }
        for (; o < out; ++o) {
            T acc = 0;
            for (i64 k = 0; k < in; ++k) acc += xb[k] * WT[k * ldw + o];
            T v = acc + (bias ? bias[o] : 0);
            yb[o] = accumulate ? yb[o] + v : v;
        }
    }
}

static T SUF(gelu)(T x) { return (T)0.5 * x * ((T)1 + ERF(x * (T)0.70710678118654752440)); }
static T SUF(sigmoid)(T x) { return (T)1 / ((T)1 + EXP(-x)); }

/* z <- B(z) over n coordinates (when bounded) */
static void SUF(bound)(T *restrict z, i64 n, T radius, int bounded)
{
    if (!bounded) return;
    T sq = 0;
    for (i64 i = 0; i < n; ++i) sq += z[i] * z[i];
    T norm = SQRT(sq);
    if (norm < (T)1e-8) norm = (T)1e-8;
    T scale = radius / norm;
    if (scale > (T)1) scale = (T)1;
    for (i64 i = 0; i < n; ++i) z[i] = radius * TANH(z[i] * scale / radius);
}

/* z_b <- B(z_b + scale a_b) for each of the B rows (z [B, d]; a's rows are wide apart) */
static void SUF(add_scaled_bound)(T *restrict z, const T *restrict a, i64 B, i64 d, i64 wide, T scale, T radius,
                                  int bounded)
{
    for (i64 b = 0; b < B; ++b) {
        T *zb = z + b * d;
        for (i64 i = 0; i < d; ++i) zb[i] += a[b * wide + i] * scale;
        SUF(bound)(zb, d, radius, bounded);
    }
}

int SUF(drm_decode_step)(void *const *p, const i64 *n, const double *r)
{
    const i64 B = n[I_BATCH], d = n[I_STATE], dt = n[I_TOKEN], V = n[I_VOCAB];
    const i64 H = n[I_FLOW_HIDDEN], nout = n[I_FLOW_OUT], nd = n[I_DIRECTIONS], rk = n[I_RANK];
    const i64 M = n[I_MIX_HIDDEN], layers = n[I_MIX_LAYERS], K = n[I_KERNEL], Hm = n[I_MEM_HIDDEN];
    const i64 He = n[I_EMIT_HIDDEN];
    const int bounded = (int)n[I_BOUNDED];
    const T R = (T)r[R_RADIUS];
    const i64 *tokens = (const i64 *)p[P_TOKENS];
    const T *E = (const T *)p[P_EMBEDDING];
    const T *z_start = (const T *)p[P_Z_START];
    T *z = (T *)p[P_Z_OUT];

    i64 wide = H > M ? H : M;
    if (Hm > wide) wide = Hm;
    if (He > wide) wide = He;
    if (nout > wide) wide = nout;
    if (d > wide) wide = d;
    /* e [B, dt] | delta [B, d] | two [B, wide] work rows | a [B, wide] | small [2 rk] */
    size_t count = (size_t)(B * dt + B * d + 3 * B * wide + 2 * rk + 1);
    T *work = (T *)malloc(count * sizeof(T));
    if (!work) return -1;
    T *e = work, *delta = e + B * dt, *h = delta + B * d, *g = h + B * wide, *a = g + B * wide;
    T *small = a + B * wide;

    for (i64 b = 0; b < B; ++b) memcpy(e + b * dt, E + tokens[b] * dt, (size_t)dt * sizeof(T));
    memcpy(z, z_start, (size_t)(B * d) * sizeof(T));
    const T *dim_d = (const T *)p[P_DIM_D], *rho = (const T *)p[P_RHO];

    /* ---------------------------------------------------------------- geometry and prefix */
    if (n[I_HAS_PREFIX]) {
        const T *W1 = (const T *)p[P_FLOW_W1];
        const T *sp = (const T *)p[P_STATE_PART];
        const T *gates = (const T *)p[P_GATES], *V_ = (const T *)p[P_DIRECTIONS];
        const T *damped = (const T *)p[P_DAMPED], *U = (const T *)p[P_U], *Sc = (const T *)p[P_SCALED];
        const T *L = (const T *)p[P_CHOL], *dsum = (const T *)p[P_DELTA_SUM];
        T *dsum_out = (T *)p[P_DELTA_SUM_OUT];
        const T s = (T)r[R_STRENGTH], step = (T)r[R_DT];
        SUF(linear)(B, dt, H, e, dt, W1 + d * H, H, (const T *)p[P_FLOW_B1], h, wide, 0);
        for (i64 b = 0; b < B; ++b)
            for (i64 j = 0; j < H; ++j) h[b * wide + j] = SUF(gelu)(sp[b * H + j] + h[b * wide + j]);
        SUF(linear)(B, H, nout, h, wide, (const T *)p[P_FLOW_W2], nout, (const T *)p[P_FLOW_B2], g, wide, 0);
        for (i64 b = 0; b < B; ++b) {
            T *c = g + b * wide, *v = a + b * wide;
            for (i64 j = 0; j < nout; ++j) c[j] = TANH(c[j]);
            if (V_) {
                for (i64 i = 0; i < d; ++i) v[i] = 0;
                for (i64 j = 0; j < nd; ++j) {
                    T cj = c[j] * gates[b * nd + j];
                    const T *vj = V_ + (b * nd + j) * d;
                    for (i64 i = 0; i < d; ++i) v[i] += cj * vj[i];
                }
            } else {
                for (i64 i = 0; i < d; ++i) v[i] = c[i];
            }
            if (damped) {
                T *sol = h + b * wide; /* h is free again */
                for (i64 i = 0; i < d; ++i) sol[i] = v[i] / damped[b * d + i];
                if (U && rk > 0) {
                    const T *Ub = U + b * d * rk, *Sb = Sc + b * d * rk, *Lb = L + b * rk * rk;
                    T *t = small, *y = small + rk;
                    for (i64 q = 0; q < rk; ++q) t[q] = 0;
                    for (i64 i = 0; i < d; ++i)
                        for (i64 q = 0; q < rk; ++q) t[q] += Ub[i * rk + q] * sol[i];
                    for (i64 q = 0; q < rk; ++q) { /* L y = t */
                        T acc = t[q];
                        for (i64 k = 0; k < q; ++k) acc -= Lb[q * rk + k] * y[k];
                        y[q] = acc / Lb[q * rk + q];
                    }
                    for (i64 q = rk - 1; q >= 0; --q) { /* L^T x = y */
                        T acc = y[q];
                        for (i64 k = q + 1; k < rk; ++k) acc -= Lb[k * rk + q] * t[k];
                        t[q] = acc / Lb[q * rk + q];
                    }
                    for (i64 i = 0; i < d; ++i) {
                        T acc = 0;
                        for (i64 q = 0; q < rk; ++q) acc += Sb[i * rk + q] * t[q];
                        sol[i] -= acc;
                    }
                }
                for (i64 i = 0; i < d; ++i) v[i] = v[i] * ((T)1 - s) + sol[i] * s;
            }
            const T *zs = z_start + b * d;
            T *db = delta + b * d, *zb = z + b * d, *so = dsum_out + b * d;
            for (i64 i = 0; i < d; ++i) db[i] = zs[i] + v[i] * step;
            SUF(bound)(db, d, R, bounded);
            for (i64 i = 0; i < d; ++i) {
                db[i] -= zs[i];
                so[i] = dsum[b * d + i] + db[i];
                zb[i] = zs[i] + so[i];
            }
            SUF(bound)(zb, d, R, bounded);
        }
    }

    /* ---------------------------------------------------------------- causal mixer */
    if (n[I_HAS_MIXER]) {
        const T *W = (const T *)p[P_MIX_W];
        const i64 ldw = 3 * d + dt + 2;
        const T *prev = (const T *)p[P_MIX_PREVIOUS];
        memcpy(p[P_MIX_PREVIOUS_OUT], z, (size_t)(B * d) * sizeof(T));
        SUF(linear)(B, dt, M, e, dt, W + 3 * d * M, M, (const T *)p[P_MIX_B], h, wide, 0);
        for (i64 b = 0; b < B; ++b) {
            T dd = dim_d ? dim_d[b] : 0, rr = rho ? rho[b] : 0;
            for (i64 j = 0; j < M; ++j) h[b * wide + j] += W[(ldw - 2) * M + j] * dd + W[(ldw - 1) * M + j] * rr;
        }
        SUF(linear)(B, d, M, z, d, W, M, NULL, h, wide, 1);
        if (n[I_HAS_PREFIX]) {
            for (i64 b = 0; b < B; ++b)
                for (i64 i = 0; i < d; ++i) a[b * wide + i] = z[b * d + i] - prev[b * d + i];
            SUF(linear)(B, d, M, a, wide, W + d * M, M, NULL, h, wide, 1);
            SUF(linear)(B, d, M, delta, d, W + 2 * d * M, M, NULL, h, wide, 1);
        }
        for (i64 b = 0; b < B; ++b)
            for (i64 j = 0; j < M; ++j) {
                T x = h[b * wide + j];
                h[b * wide + j] = x * SUF(sigmoid)(x);
            }
        for (i64 l = 0; l < layers; ++l) {
            void *const *q = p + P_LAYERS + P_PER_LAYER * l;
            const T *cw = (const T *)q[0], *cb = (const T *)q[1], *ctx = (const T *)q[4];
            T *ctx_out = (T *)q[5];
            const i64 dil = n[I_DILATIONS + l], Lc = dil * (K - 1);
            for (i64 b = 0; b < B; ++b) {
                const T *cb_ = ctx + b * Lc * M;
                T *co = ctx_out + b * Lc * M;
                T *hb = h + b * wide, *yb = g + b * wide;
                for (i64 c = 0; c < M; ++c) { /* the window: context rows 0 .. Lc - 1, then h */
                    T acc = 0;
                    for (i64 j = 0; j < K; ++j) {
                        i64 row = j * dil;
                        T xv = row < Lc ? cb_[row * M + c] : hb[c];
                        acc += cw[c * K + j] * xv;
                    }
                    acc += cb ? cb[c] : 0;
                    yb[c] = acc * SUF(sigmoid)(acc); /* silu(y) */
                }
                if (Lc > 0) {
                    memcpy(co, cb_ + M, (size_t)((Lc - 1) * M) * sizeof(T));
                    memcpy(co + (Lc - 1) * M, hb, (size_t)M * sizeof(T));
                }
            }
            SUF(linear)(B, M, M, g, wide, (const T *)q[2], M, (const T *)q[3], h, wide, 1);
        }
        SUF(linear)(B, M, d, h, wide, (const T *)p[P_MIX_OUT_W], d, (const T *)p[P_MIX_OUT_B], a, wide, 0);
        SUF(add_scaled_bound)(z, a, B, d, wide, (T)r[R_MIX_SCALE], R, bounded);
    }

    /* ---------------------------------------------------------------- token residual */
    if (n[I_HAS_RESIDUAL]) {
        SUF(linear)(B, dt, d, e, dt, (const T *)p[P_RES_W], d, NULL, a, wide, 0);
        SUF(add_scaled_bound)(z, a, B, d, wide, (T)r[R_RES_SCALE], R, bounded);
    }

    /* ---------------------------------------------------------------- selective memory */
    if (n[I_HAS_MEMORY]) {
        const T *W = (const T *)p[P_MEM_W], *mprev = (const T *)p[P_MEM_M];
        T *m_out = (T *)p[P_MEM_M_OUT];
        memcpy(p[P_MEM_PREVIOUS_OUT], z, (size_t)(B * d) * sizeof(T));
        SUF(linear)(B, dt, Hm, e, dt, W + d * Hm, Hm, (const T *)p[P_MEM_B], h, wide, 0);
        SUF(linear)(B, d, Hm, (const T *)p[P_MEM_PREVIOUS], d, W, Hm, NULL, h, wide, 1);
        for (i64 b = 0; b < B; ++b)
            for (i64 j = 0; j < Hm; ++j) {
                T x = h[b * wide + j];
                h[b * wide + j] = x * SUF(sigmoid)(x);
            }
        const T fb = (T)r[R_FORGET_BIAS], scale = (T)r[R_MEM_SCALE];
        SUF(linear)(B, Hm, d, h, wide, (const T *)p[P_MEM_FW], d, (const T *)p[P_MEM_FB], a, wide, 0);
        SUF(linear)(B, Hm, d, h, wide, (const T *)p[P_MEM_WW], d, (const T *)p[P_MEM_WB], g, wide, 0);
        for (i64 b = 0; b < B; ++b)
            for (i64 i = 0; i < d; ++i) {
                a[b * wide + i] = SUF(sigmoid)(a[b * wide + i] + fb);
                g[b * wide + i] = SUF(sigmoid)(g[b * wide + i]);
            }
        /* the candidate into delta's rows (delta is read no more) */
        SUF(linear)(B, Hm, d, h, wide, (const T *)p[P_MEM_CW], d, (const T *)p[P_MEM_CB], delta, d, 0);
        for (i64 b = 0; b < B; ++b) {
            T *zb = z + b * d, *mb = m_out + b * d;
            for (i64 i = 0; i < d; ++i) {
                mb[i] = a[b * wide + i] * mprev[b * d + i] + g[b * wide + i] * TANH(delta[b * d + i]);
                zb[i] += mb[i] * scale;
            }
            SUF(bound)(zb, d, R, bounded);
        }
    }

    /* ---------------------------------------------------------------- emitter */
    {
        const T *nw = (const T *)p[P_NORM_W];
        const T eps = (T)r[R_NORM_EPS];
        for (i64 b = 0; b < B; ++b) {
            const T *zb = z + b * d;
            T sq = 0;
            for (i64 i = 0; i < d; ++i) sq += zb[i] * zb[i];
            T inv = (T)1 / SQRT(sq / (T)d + eps);
            for (i64 i = 0; i < d; ++i) a[b * wide + i] = zb[i] * inv * nw[i];
        }
        SUF(linear)(B, d, He, a, wide, (const T *)p[P_EMIT_W1], He, (const T *)p[P_EMIT_B1], h, wide, 0);
        for (i64 b = 0; b < B; ++b)
            for (i64 j = 0; j < He; ++j) h[b * wide + j] = SUF(gelu)(h[b * wide + j]);
        SUF(linear)(B, He, V, h, wide, (const T *)p[P_EMIT_W2], V, (const T *)p[P_EMIT_B2], (T *)p[P_LOGITS], V, 0);
    }
    free(work);
    return 0;
}

#endif
