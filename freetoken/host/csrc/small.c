/* The small per-token ops of a decode step on the host (RMSNorm, rotary embedding, softmax top-k routing): one call
 * each instead of a dozen torch ops, same formulas as the references in freetoken/kernels. */
#include <math.h>
#include <string.h>
#include <stdlib.h>
#include "fastmath.h"
#include "ftk.h"

/* rows of x [T, D] (row stride x_stride) -> out [T, D]: normalise in fp32, (round to the dtype), times w, rounded.
 * Rows in parallel (threads), each row's loops vectorised: the prefill of a long prompt normalises T x D values. */
static void load_row(const void *x, int32_t kind, int64_t off, int D, float *dst) {
    if (kind == FT_BF16) {
        const uint16_t *p = (const uint16_t *)x + off;
#pragma omp simd
        for (int d = 0; d < D; d++) dst[d] = ft_bf16_to_f32(p[d]);
    } else if (kind == FT_F16) {
        for (int d = 0; d < D; d++) dst[d] = ft_f16_to_f32(((const uint16_t *)x)[off + d]);
    } else {
        memcpy(dst, (const float *)x + off, (size_t)D * 4);
    }
}

static void store_row(void *out, int32_t kind, int64_t off, int D, const float *src) {
    if (kind == FT_BF16) {
        uint16_t *p = (uint16_t *)out + off;
#pragma omp simd
        for (int d = 0; d < D; d++) p[d] = ft_f32_to_bf16(src[d]);
    } else if (kind == FT_F16) {
        for (int d = 0; d < D; d++) ((uint16_t *)out)[off + d] = ft_f32_to_f16(src[d]);
    } else {
        memcpy((float *)out + off, src, (size_t)D * 4);
    }
}

int ft_rms_norm(const void *x, int32_t kind, int64_t x_stride, int32_t T, int32_t D, const void *w, int32_t w_kind,
                float eps, int32_t round_normed, void *out, int64_t out_stride, int32_t threads) {
    float *wf = (float *)malloc((size_t)D * 4);
    if (!wf) return FT_ENOMEM;
    load_row(w, w_kind, 0, D, wf);
    const int nt = T >= 8 && threads > 1 ? threads : 1;
    int bad = 0;
#pragma omp parallel num_threads(nt)
    {
        float *row = (float *)malloc((size_t)D * 4);
        if (!row) {
#pragma omp atomic write
            bad = 1;
        }
#pragma omp for schedule(static)
        for (int t = 0; t < T; t++) {
            if (!row) continue;
            load_row(x, kind, (int64_t)t * x_stride, D, row);
            float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
            for (int d = 0; d < D; d++) ss += row[d] * row[d];
            const float inv = 1.0f / sqrtf(ss / (float)D + eps);
            if (round_normed && kind == FT_BF16) {
#pragma omp simd
                for (int d = 0; d < D; d++) row[d] = wf[d] * ft_bf16_to_f32(ft_f32_to_bf16(row[d] * inv));
            } else if (round_normed) {
                for (int d = 0; d < D; d++) row[d] = wf[d] * ft_round_act(row[d] * inv, kind);
            } else {
#pragma omp simd
                for (int d = 0; d < D; d++) row[d] = wf[d] * (row[d] * inv);
            }
            store_row(out, kind, (int64_t)t * out_stride, D, row);
        }
        free(row);
    }
    free(wf);
    return bad ? FT_ENOMEM : FT_OK;
}

/* one head's row of rope: x1 / x2 the halves, c / s the position's cos / sin (times scale); bf16 and fp32 vectorised */
static inline void rope_row(const void *x, int32_t kind, int64_t src, void *out, int64_t dst, int half,
                            const float *c, const float *s) {
    if (kind == FT_BF16) {
        const uint16_t *a = (const uint16_t *)x + src, *b = a + half;
        uint16_t *o = (uint16_t *)out + dst, *o2 = o + half;
#pragma omp simd
        for (int i = 0; i < half; i++) {
            const float x1 = ft_bf16_to_f32(a[i]), x2 = ft_bf16_to_f32(b[i]);
            o[i] = ft_f32_to_bf16(x1 * c[i] - x2 * s[i]);
            o2[i] = ft_f32_to_bf16(x2 * c[i] + x1 * s[i]);
        }
    } else if (kind == FT_F32) {
        const float *a = (const float *)x + src, *b = a + half;
        float *o = (float *)out + dst, *o2 = o + half;
#pragma omp simd
        for (int i = 0; i < half; i++) {
            o[i] = a[i] * c[i] - b[i] * s[i];
            o2[i] = b[i] * c[i] + a[i] * s[i];
        }
    } else {
        for (int i = 0; i < half; i++) {
            const float x1 = ft_load_act(x, kind, src + i), x2 = ft_load_act(x, kind, src + half + i);
            ft_store_act(out, kind, dst + i, x1 * c[i] - x2 * s[i]);
            ft_store_act(out, kind, dst + half + i, x2 * c[i] + x1 * s[i]);
        }
    }
}

/* x [T, H, Dh] (strides sx_t, sx_h) -> out [T, H, Dh] contiguous: the first rotary dims rotated by position * inv_freq
 * (rotate_half, cos / sin times scale) in fp32, the rest copied. Tokens in parallel (threads): a long prompt's
 * cos / sin are T x rotary / 2 libm calls, most of the op's time. */
int ft_rope(const void *x, int32_t kind, int64_t sx_t, int64_t sx_h, int32_t T, int32_t H, int32_t Dh,
            const int64_t *positions, const float *inv_freq, int32_t rotary, float scale, void *out,
            int32_t threads) {
    const int half = rotary / 2;
    if (half > 512) return FT_ESHAPE;
    const int nt = T >= 8 && threads > 1 ? threads : 1;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < T; t++) {
        float c[512], s[512];
        for (int i = 0; i < half; i++) {
            const float a = (float)positions[t] * inv_freq[i];
            c[i] = cosf(a) * scale;
            s[i] = sinf(a) * scale;
        }
        for (int h = 0; h < H; h++) {
            const int64_t src = t * sx_t + h * sx_h, dst = ((int64_t)t * H + h) * Dh;
            rope_row(x, kind, src, out, dst, half, c, s);
            for (int i = rotary; i < Dh; i++) ft_store_act(out, kind, dst + i, ft_load_act(x, kind, src + i));
        }
    }
    return FT_OK;
}

/* logits [T, E] -> the K largest softmax probabilities (ties: the lower id first) and their ids; renormalised to sum
 * to one if asked, times scale. Tokens in parallel (threads); the K best kept sorted while the E probabilities pass
 * once (a later id displaces only a strictly larger one: ties stay with the lower id). */
int ft_softmax_topk(const void *logits, int32_t kind, int32_t T, int32_t E, int32_t K, int32_t renormalize,
                    float scale, float *weights, int32_t *ids, int32_t threads) {
    if (E > 4096 || K > E || K < 1) return FT_ESHAPE;
    const int nt = T >= 8 && threads > 1 ? threads : 1;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < T; t++) {
        float p[4096];
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; e++) {
            p[e] = ft_load_act(logits, kind, (int64_t)t * E + e);
            mx = fmaxf(mx, p[e]);
        }
        for (int e = 0; e < E; e++) sum += (p[e] = expf(p[e] - mx));
        for (int e = 0; e < E; e++) p[e] /= sum;
        float *w = weights + (int64_t)t * K;
        int32_t *id = ids + (int64_t)t * K;
        int n = 0;  /* w[0..n) the best so far, largest first */
        for (int e = 0; e < E; e++) {
            const float v = p[e];
            if (n == K && !(v > w[K - 1])) continue;  /* (a NaN displaces nothing) */
            int j = n < K ? n++ : K - 1;
            while (j > 0 && v > w[j - 1]) {
                w[j] = w[j - 1];
                id[j] = id[j - 1];
                j--;
            }
            w[j] = v;
            id[j] = e;
        }
        float picked = 0.0f;
        for (int k = 0; k < K; k++) picked += w[k];
        for (int k = 0; k < K; k++) w[k] = (renormalize ? w[k] / picked : w[k]) * scale;
    }
    return FT_OK;
}
