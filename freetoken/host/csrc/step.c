/* A decode token's attention after its qkv projection, in one call for a batch of sequences (each T = 1): the same
 * arithmetic as the engine's torch glue (freetoken/engine/model.py _project / _attend) with the references'
 * roundings: normalised rows rounded to the activation dtype, rotary embedding in fp32 rounded once, k and v stored
 * in the cache's dtype; then ft_attention_decode over each sequence's cache. */
#include <math.h>
#include <string.h>
#include "ftk.h"

/* n values at src (activation dtype) -> dst fp32, RMS-normalised with weight w (offset w_off) if given, each value
 * rounded to the dtype as the reference's output is */
static void norm_span(const void *src, int32_t kind, int64_t off, int n, const void *w, int32_t w_kind,
                      int64_t w_off, float eps, int round_normed, float *dst) {
    for (int i = 0; i < n; i++) dst[i] = ft_load_act(src, kind, off + i);
    if (!w) return;
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += dst[i] * dst[i];
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) {
        float v = dst[i] * inv;
        if (round_normed) v = ft_round_act(v, kind);
        dst[i] = ft_round_act(ft_load_act(w, w_kind, w_off + i) * v, kind);
    }
}

/* heads [nh, Dh] fp32 (dtype-exact values) roped at pos, stored to dst (element offset) in kind */
static void rope_store(const float *v, int nh, int Dh, int64_t pos, const float *inv_freq, int rotary, float scale,
                       void *dst, int32_t kind, int64_t off) {
    const int half = rotary > 0 ? rotary / 2 : 0;
    float c[512], s[512];
    for (int i = 0; i < half; i++) {
        const float a = (float)pos * inv_freq[i];
        c[i] = cosf(a) * scale;
        s[i] = sinf(a) * scale;
    }
    for (int h = 0; h < nh; h++) {
        const float *x = v + h * Dh;
        const int64_t o = off + (int64_t)h * Dh;
        for (int i = 0; i < half; i++) {
            ft_store_act(dst, kind, o + i, x[i] * c[i] - x[half + i] * s[i]);
            ft_store_act(dst, kind, o + half + i, x[half + i] * c[i] + x[i] * s[i]);
        }
        for (int i = 2 * half; i < Dh; i++) ft_store_act(dst, kind, o + i, x[i]);
    }
}

int ft_attention_step(const ft_step_args *a) {
    const int B = a->B, H = a->H, Hkv = a->Hkv, Dh = a->Dh;
    if (a->rotary > 1024 || Hkv <= 0 || H % Hkv) return FT_ESHAPE;
    float buf[16384];
    if ((H > Hkv ? H : Hkv) * Dh > 16384) return FT_ESHAPE;
    for (int b = 0; b < B; b++) {
        const int64_t row = (int64_t)b * a->qkv_stride, pos = a->positions[b];
        const int nq = H * Dh, nk = Hkv * Dh;
        /* q */
        if (a->norm_full) norm_span(a->qkv, a->kind, row, nq, a->q_norm, a->norm_kind, 0, a->eps, a->round_normed, buf);
        else
            for (int h = 0; h < H; h++)
                norm_span(a->qkv, a->kind, row + (int64_t)h * Dh, Dh, a->q_norm, a->norm_kind, 0, a->eps,
                          a->round_normed, buf + h * Dh);
        rope_store(buf, H, Dh, pos, a->inv_freq, a->rotary, a->rope_scale, a->q_buf, a->kind, (int64_t)b * nq);
        /* k, into the cache at pos */
        if (a->norm_full) norm_span(a->qkv, a->kind, row + nq, nk, a->k_norm, a->norm_kind, 0, a->eps, a->round_normed, buf);
        else
            for (int h = 0; h < Hkv; h++)
                norm_span(a->qkv, a->kind, row + nq + (int64_t)h * Dh, Dh, a->k_norm, a->norm_kind, 0, a->eps,
                          a->round_normed, buf + h * Dh);
        if (a->kv_kind == a->kind || a->kind == FT_F32)
            rope_store(buf, Hkv, Dh, pos, a->inv_freq, a->rotary, a->rope_scale, a->k_cache[b], a->kv_kind, pos * nk);
        else { /* rounded to the activation dtype first (the k tensor), then to the cache's */
            float tmp[16384];
            rope_store(buf, Hkv, Dh, pos, a->inv_freq, a->rotary, a->rope_scale, tmp, FT_F32, 0);
            for (int i = 0; i < nk; i++)
                ft_store_act(a->k_cache[b], a->kv_kind, pos * nk + i, ft_round_act(tmp[i], a->kind));
        }
        /* v, into the cache at pos */
        for (int i = 0; i < nk; i++)
            ft_store_act(a->v_cache[b], a->kv_kind, pos * nk + i, ft_load_act(a->qkv, a->kind, row + nq + nk + i));
    }
    int32_t lens[256];
    const void *ks[256], *vs[256];
    if (B > 256) return FT_ESHAPE;
    for (int b = 0; b < B; b++) lens[b] = (int32_t)a->positions[b] + 1, ks[b] = a->k_cache[b], vs[b] = a->v_cache[b];
    ft_attn_args at = {B, H, Hkv, Dh, a->q_buf, a->kind, ks, vs, NULL, NULL, a->kv_kind, lens, a->sm_scale, a->sinks,
                       a->window, a->out, a->kind, a->threads};
    return ft_attention_decode(&at);
}
