/* The small per-token ops of a decode step on the host (RMSNorm, rotary embedding, softmax top-k routing): one call
 * each instead of a dozen torch ops, same formulas as the references in freetoken/kernels. */
#include <math.h>
#include <string.h>
#include "fastmath.h"
#include "ftk.h"

static inline void put(void *out, int32_t kind, int64_t i, float v) {
    if (kind == FT_BF16) ((uint16_t *)out)[i] = ft_f32_to_bf16(v);
    else if (kind == FT_F16) ((uint16_t *)out)[i] = ft_f32_to_f16(v);
    else ((float *)out)[i] = v;
}

/* rows of x [T, D] (row stride x_stride) -> out [T, D]: normalise in fp32, (round to the dtype), times w, rounded */
int ft_rms_norm(const void *x, int32_t kind, int64_t x_stride, int32_t T, int32_t D, const void *w, int32_t w_kind,
                float eps, int32_t round_normed, void *out, int64_t out_stride) {
    for (int t = 0; t < T; t++) {
        float ss = 0.0f;
        for (int d = 0; d < D; d++) {
            float v = ft_load_act(x, kind, (int64_t)t * x_stride + d);
            ss += v * v;
        }
        const float inv = 1.0f / sqrtf(ss / (float)D + eps);
        for (int d = 0; d < D; d++) {
            float n = ft_load_act(x, kind, (int64_t)t * x_stride + d) * inv;
            if (round_normed) n = ft_round_act(n, kind);
            put(out, kind, (int64_t)t * out_stride + d, ft_load_act(w, w_kind, d) * n);
        }
    }
    return FT_OK;
}

/* x [T, H, Dh] (strides sx_t, sx_h) -> out [T, H, Dh] contiguous: the first rotary dims rotated by position * inv_freq
 * (rotate_half, cos / sin times scale) in fp32, the rest copied */
int ft_rope(const void *x, int32_t kind, int64_t sx_t, int64_t sx_h, int32_t T, int32_t H, int32_t Dh,
            const int64_t *positions, const float *inv_freq, int32_t rotary, float scale, void *out) {
    const int half = rotary / 2;
    float c[512], s[512];
    if (half > 512) return FT_ESHAPE;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            const float a = (float)positions[t] * inv_freq[i];
            c[i] = cosf(a) * scale;
            s[i] = sinf(a) * scale;
        }
        for (int h = 0; h < H; h++) {
            const int64_t src = t * sx_t + h * sx_h, dst = ((int64_t)t * H + h) * Dh;
            for (int i = 0; i < half; i++) {
                const float x1 = ft_load_act(x, kind, src + i), x2 = ft_load_act(x, kind, src + half + i);
                put(out, kind, dst + i, x1 * c[i] - x2 * s[i]);
                put(out, kind, dst + half + i, x2 * c[i] + x1 * s[i]);
            }
            for (int i = rotary; i < Dh; i++) put(out, kind, dst + i, ft_load_act(x, kind, src + i));
        }
    }
    return FT_OK;
}

/* logits [T, E] -> the K largest softmax probabilities (ties: the lower id first) and their ids; renormalised to sum
 * to one if asked, times scale */
int ft_softmax_topk(const void *logits, int32_t kind, int32_t T, int32_t E, int32_t K, int32_t renormalize,
                    float scale, float *weights, int32_t *ids) {
    float p[4096];
    if (E > 4096 || K > E) return FT_ESHAPE;
    for (int t = 0; t < T; t++) {
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; e++) {
            p[e] = ft_load_act(logits, kind, (int64_t)t * E + e);
            mx = fmaxf(mx, p[e]);
        }
        for (int e = 0; e < E; e++) sum += (p[e] = expf(p[e] - mx));
        for (int e = 0; e < E; e++) p[e] /= sum;
        float *w = weights + (int64_t)t * K;
        int32_t *id = ids + (int64_t)t * K;
        float picked = 0.0f;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= id[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            id[k] = best;
            w[k] = p[best];
            picked += p[best];
        }
        for (int k = 0; k < K; k++) w[k] = (renormalize ? w[k] / picked : w[k]) * scale;
    }
    return FT_OK;
}
