/* Decode attention for a batch of sequences in one call, each against its own KV cache (no gather into one padded
 * tensor, no per-sequence Python): one work item per (sequence, kv head), so the rows of a kv head are read once for
 * all the query heads that share it (GQA). fp32 scores and softmax, the sink logit (gpt-oss) joining the
 * denominator, an fp8 cache dequantized by its per-(position, kv head) scale as it is read.
 * With AVX-512 or AVX2 (head dim a multiple of 16 or 8, a bf16 / fp16 / fp32 cache) K and V are read straight into
 * registers: four query heads' dot products per key row and one shuffle reduction for the four, the weighted sum of
 * V rows accumulated in registers over the positions. The portable build (FT_NO_AVX512) takes the AVX2 form. */
#include <math.h>
#include <omp.h>
#include <string.h>
#include "arena.h"
#include "fastmath.h"
#include "ftk.h"

static float E4M3[256];

__attribute__((constructor)) static void init_e4m3(void) {
    for (int b = 0; b < 256; b++) {
        int e = (b >> 3) & 0xf, m = b & 7;
        float v = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf(m / 8.0f, -6);
        if ((b & 0x7f) == 0x7f) v = NAN;
        E4M3[b] = (b & 0x80) ? -v : v;
    }
}

/* row j, kv head g of a cache, as fp32 [Dh] */
static inline void kv_row(const void *base, const float *scale, int kind, int64_t j, int Hkv, int g, int Dh,
                          float *dst) {
    int64_t off = (j * Hkv + g) * Dh;
    switch (kind) {
    case FT_BF16: for (int d = 0; d < Dh; d++) dst[d] = ft_bf16_to_f32(((const uint16_t *)base)[off + d]); break;
    case FT_F16: for (int d = 0; d < Dh; d++) dst[d] = ft_f16_to_f32(((const uint16_t *)base)[off + d]); break;
    case FT_FP8: {
        float s = scale[j * Hkv + g];
        for (int d = 0; d < Dh; d++) dst[d] = E4M3[((const uint8_t *)base)[off + d]] * s;
        break;
    }
    default: memcpy(dst, (const float *)base + off, (size_t)Dh * 4);
    }
}

/* portable: scores s[i * ld + j] and the weighted V sum acc [G, Dh] of one (sequence, kv head) */
static void scores_generic(const void *k, const float *ks, int kind, int lo, int L, int Hkv, int g, int Dh,
                           const float *q, int G, float scale, float *s, int64_t ld, float *row) {
    for (int j = lo; j < L; j++) {
        kv_row(k, ks, kind, j, Hkv, g, Dh, row);
        for (int i = 0; i < G; i++) {
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int d = 0; d < Dh; d++) dot += q[i * Dh + d] * row[d];
            s[(int64_t)i * ld + j] = dot * scale;
        }
    }
}

static void values_generic(const void *v, const float *vs, int kind, int lo, int L, int Hkv, int g, int Dh,
                           const float *s, int G, int64_t ld, float *acc, float *row) {
    memset(acc, 0, (size_t)G * Dh * 4);
    for (int j = lo; j < L; j++) {
        kv_row(v, vs, kind, j, Hkv, g, Dh, row);
        for (int i = 0; i < G; i++) {
            const float p = s[(int64_t)i * ld + j];
#pragma omp simd
            for (int d = 0; d < Dh; d++) acc[i * Dh + d] += p * row[d];
        }
    }
}

#if defined(__AVX512F__) && !defined(FT_NO_AVX512)
#include <immintrin.h>
#define KV_W 16 /* lanes per vector */
#define KV_NC 4 /* V chunks of KV_W dims one values pass holds per query head */
typedef __m512 kv_vec;
#define kv_zero _mm512_setzero_ps
#define kv_fma _mm512_fmadd_ps
#define kv_loadu _mm512_loadu_ps
#define kv_storeu _mm512_storeu_ps
#define kv_set1 _mm512_set1_ps
static inline kv_vec kv_load(const void *base, int kind, int64_t off) {
    const uint16_t *h = (const uint16_t *)base + off; /* bf16 / fp16 */
    if (kind == FT_BF16) return ft_bf16x16(h);
    if (kind == FT_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
    return _mm512_loadu_ps((const float *)base + off);
}

/* the four sums of a0..a3 in lanes 0..3 */
static inline __m128 kv_reduce4(kv_vec a0, kv_vec a1, kv_vec a2, kv_vec a3) {
    __m512 a01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    __m512 a23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    __m512 b = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a01), _mm512_castps_pd(a23))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a01), _mm512_castps_pd(a23))));
    __m512 c = _mm512_add_ps(b, _mm512_shuffle_f32x4(b, b, 0x4E));
    c = _mm512_add_ps(c, _mm512_shuffle_f32x4(c, c, 0xB1));
    return _mm512_castps512_ps128(c);
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KV_W 8
#define KV_NC 2 /* 4 heads x 2 chunks of accumulators and 2 V chunks: 10 of the 16 ymm registers */
typedef __m256 kv_vec;
#define kv_zero _mm256_setzero_ps
#define kv_fma _mm256_fmadd_ps
#define kv_loadu _mm256_loadu_ps
#define kv_storeu _mm256_storeu_ps
#define kv_set1 _mm256_set1_ps
static inline kv_vec kv_load(const void *base, int kind, int64_t off) {
    const uint16_t *h = (const uint16_t *)base + off; /* bf16 / fp16 */
    if (kind == FT_BF16) return ft_bf16x8(h);
    if (kind == FT_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
    return _mm256_loadu_ps((const float *)base + off);
}

static inline __m128 kv_reduce4(kv_vec a0, kv_vec a1, kv_vec a2, kv_vec a3) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3)); /* [a0..a3 low | a0..a3 high] */
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}
#endif

#ifdef KV_W
/* rows this far ahead are prefetched: a cache left cold by the layer's MoE streams is otherwise read at a third of
 * the bandwidth (the rows of one kv head are 128-256 bytes in every Hkv x that: a stride the hardware prefetcher
 * follows late) */
#define FT_KV_AHEAD 16

static inline void prefetch_kv(const void *base, int kind, int64_t off, int dims) {
    const int es = kind == FT_F32 ? 4 : 2;
    const char *p = (const char *)base + off * es;
    for (int o = 0; o < dims * es; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

/* four query heads' dot products per key row (in registers), one reduction for the four */
static void scores_simd(const void *k, int kind, int lo, int L, int Hkv, int g, int Dh, const float *q, int G,
                        float scale, float *s, int64_t ld) {
    for (int i0 = 0; i0 < G; i0 += 4) {
        const int n = G - i0 < 4 ? G - i0 : 4;
        const float *qh[4];
        for (int h = 0; h < 4; h++) qh[h] = q + (i0 + (h < n ? h : 0)) * Dh;
        for (int j = lo; j < L; j++) {
            const int64_t off = ((int64_t)j * Hkv + g) * Dh;
            if (j + FT_KV_AHEAD < L) prefetch_kv(k, kind, off + (int64_t)FT_KV_AHEAD * Hkv * Dh, Dh);
            kv_vec a0 = kv_zero(), a1 = a0, a2 = a0, a3 = a0;
            for (int d = 0; d < Dh; d += KV_W) {
                const kv_vec r = kv_load(k, kind, off + d);
                a0 = kv_fma(kv_loadu(qh[0] + d), r, a0);
                a1 = kv_fma(kv_loadu(qh[1] + d), r, a1);
                a2 = kv_fma(kv_loadu(qh[2] + d), r, a2);
                a3 = kv_fma(kv_loadu(qh[3] + d), r, a3);
            }
            float out[4];
            _mm_storeu_ps(out, _mm_mul_ps(kv_reduce4(a0, a1, a2, a3), _mm_set1_ps(scale)));
            for (int h = 0; h < n; h++) s[(int64_t)(i0 + h) * ld + j] = out[h];
        }
    }
}

#if defined(__AVX512BF16__) && !defined(FT_NO_AVX512)
/* bf16 queries against a bf16 cache: dot products of bf16 pairs (exact products, fp32 sums), 32 dims per op */
static void scores_bf16(const uint16_t *k, int lo, int L, int Hkv, int g, int Dh, const uint16_t *q, int G,
                        float scale, float *s, int64_t ld) {
    for (int i0 = 0; i0 < G; i0 += 4) {
        const int n = G - i0 < 4 ? G - i0 : 4;
        const uint16_t *qh[4];
        for (int h = 0; h < 4; h++) qh[h] = q + (i0 + (h < n ? h : 0)) * Dh;
        for (int j = lo; j < L; j++) {
            const uint16_t *kr = k + ((int64_t)j * Hkv + g) * Dh;
            if (j + FT_KV_AHEAD < L) prefetch_kv(kr + (int64_t)FT_KV_AHEAD * Hkv * Dh, FT_BF16, 0, Dh);
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int d = 0; d < Dh; d += 32) {
                const __m512bh r = (__m512bh)_mm512_loadu_si512(kr + d);
                a0 = _mm512_dpbf16_ps(a0, r, (__m512bh)_mm512_loadu_si512(qh[0] + d));
                a1 = _mm512_dpbf16_ps(a1, r, (__m512bh)_mm512_loadu_si512(qh[1] + d));
                a2 = _mm512_dpbf16_ps(a2, r, (__m512bh)_mm512_loadu_si512(qh[2] + d));
                a3 = _mm512_dpbf16_ps(a3, r, (__m512bh)_mm512_loadu_si512(qh[3] + d));
            }
            float out[4];
            _mm_storeu_ps(out, _mm_mul_ps(kv_reduce4(a0, a1, a2, a3), _mm_set1_ps(scale)));
            for (int h = 0; h < n; h++) s[(int64_t)(i0 + h) * ld + j] = out[h];
        }
    }
}
#endif

/* acc [G, Dh] = sum_j s[i, j] * v_j: N heads x NC chunks of KV_W dims held in registers over the positions */
static inline __attribute__((always_inline)) void values_tile(const void *v, int kind, int lo, int L, int Hkv, int g,
                                                              int Dh, int d0, const float *s, int i0, int64_t ld,
                                                              float *acc, const int N, const int NC) {
    kv_vec a[4][KV_NC];
    for (int h = 0; h < N; h++)
        for (int c = 0; c < NC; c++) a[h][c] = kv_zero();
    for (int j = lo; j < L; j++) {
        const int64_t off = ((int64_t)j * Hkv + g) * Dh + d0;
        if (j + FT_KV_AHEAD < L) prefetch_kv(v, kind, off + (int64_t)FT_KV_AHEAD * Hkv * Dh, KV_W * NC);
        kv_vec r[KV_NC];
        for (int c = 0; c < NC; c++) r[c] = kv_load(v, kind, off + KV_W * c);
        for (int h = 0; h < N; h++) {
            const kv_vec p = kv_set1(s[(int64_t)(i0 + h) * ld + j]);
            for (int c = 0; c < NC; c++) a[h][c] = kv_fma(p, r[c], a[h][c]);
        }
    }
    for (int h = 0; h < N; h++)
        for (int c = 0; c < NC; c++) kv_storeu(acc + (i0 + h) * Dh + d0 + KV_W * c, a[h][c]);
}

static void values_simd(const void *v, int kind, int lo, int L, int Hkv, int g, int Dh, const float *s, int G,
                        int64_t ld, float *acc) {
    for (int i0 = 0; i0 < G; i0 += 4) {
        const int n = G - i0 < 4 ? G - i0 : 4;
        for (int d0 = 0; d0 < Dh; d0 += KV_W * KV_NC) {
            const int nc = (Dh - d0) / KV_W < KV_NC ? (Dh - d0) / KV_W : KV_NC;
            if (n == 4 && nc == KV_NC) values_tile(v, kind, lo, L, Hkv, g, Dh, d0, s, i0, ld, acc, 4, KV_NC);
            else if (KV_NC > 2 && n == 4 && nc == 2) values_tile(v, kind, lo, L, Hkv, g, Dh, d0, s, i0, ld, acc, 4, 2);
            else
                for (int h = 0; h < n; h++)
                    for (int c = 0; c < nc; c++) values_tile(v, kind, lo, L, Hkv, g, Dh, d0 + KV_W * c, s, i0 + h, ld,
                                                             acc, 1, 1);
        }
    }
}
#endif

/* x[j] = exp(x[j] - max) in place over n scores; returns their sum plus the sink's term (sink = -inf: none). Both
 * loops vectorise (ft_expf's clamps become selects under -fno-trapping-math); scalar, they were about a quarter of the
 * attention's time at 512 positions on AVX2. */
static float softmax_numerators(float *restrict x, int n, float sink) {
    float mx = sink;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; j++) {
        x[j] = ft_expf(x[j] - mx);
        sum += x[j];
    }
    return sink == -INFINITY ? sum : sum + ft_expf(sink - mx);
}

int ft_attention_decode(const ft_attn_args *a) {
    const int B = a->B, H = a->H, Hkv = a->Hkv, Dh = a->Dh, G = H / Hkv;
    if (Hkv <= 0 || H % Hkv) return FT_ESHAPE;
    int maxlen = 1;
    for (int b = 0; b < B; b++) if (a->len[b] > maxlen) maxlen = a->len[b];
    const int nt = a->threads > 0 ? a->threads : 1;
    const size_t per_thread = ((size_t)G * maxlen + (size_t)G * Dh * 2 + (size_t)G + 2 * (size_t)Dh + 64) * 4;
    ft_arena *ar = ft_arena_reset(per_thread * nt);
    if (!ar) return FT_ENOMEM;
    uint8_t *mem = ft_arena_take(ar, per_thread * nt);
#ifdef KV_W
    const int fast = Dh % KV_W == 0 && a->kv_kind != FT_FP8;
#else
    const int fast = 0; /* no vector path in this build */
    (void)fast;
#endif
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int item = 0; item < B * Hkv; item++) {
        const int b = item / Hkv, g = item % Hkv, L = a->len[b];
        const int lo = a->window > 0 && L > a->window ? L - a->window : 0;
        float *s = (float *)(mem + per_thread * omp_get_thread_num()); /* [G, maxlen] scores */
        float *q = s + (size_t)G * maxlen, *acc = q + (size_t)G * Dh, *denom = acc + (size_t)G * Dh;
        float *row = denom + G;
        for (int i = 0; i < G; i++)
            for (int d = 0; d < Dh; d++)
                q[i * Dh + d] = ft_load_act(a->q, a->q_kind, ((int64_t)b * H + g * G + i) * Dh + d);
        const float *ks = a->k_scale ? a->k_scale[b] : NULL, *vs = a->v_scale ? a->v_scale[b] : NULL;
#if defined(__AVX512BF16__) && !defined(FT_NO_AVX512)
        if (fast && a->kv_kind == FT_BF16 && a->q_kind == FT_BF16 && Dh % 32 == 0)
            scores_bf16((const uint16_t *)a->k[b], lo, L, Hkv, g, Dh,
                        (const uint16_t *)a->q + ((int64_t)b * H + g * G) * Dh, G, a->sm_scale, s, maxlen);
        else
#endif
#ifdef KV_W
        if (fast) scores_simd(a->k[b], a->kv_kind, lo, L, Hkv, g, Dh, q, G, a->sm_scale, s, maxlen);
        else
#endif
            scores_generic(a->k[b], ks, a->kv_kind, lo, L, Hkv, g, Dh, q, G, a->sm_scale, s, maxlen, row);
        for (int i = 0; i < G; i++)
            denom[i] = softmax_numerators(s + (size_t)i * maxlen + lo, L - lo,
                                          a->sinks ? a->sinks[g * G + i] : -INFINITY);
#ifdef KV_W
        if (fast) values_simd(a->v[b], a->kv_kind, lo, L, Hkv, g, Dh, s, G, maxlen, acc);
        else
#endif
            values_generic(a->v[b], vs, a->kv_kind, lo, L, Hkv, g, Dh, s, G, maxlen, acc, row);
        for (int i = 0; i < G; i++)
            for (int d = 0; d < Dh; d++)
                ft_store_act(a->out, a->out_kind, ((int64_t)b * H + g * G + i) * Dh + d, acc[i * Dh + d] / denom[i]);
    }
    return FT_OK;
}
