/* Path A: one row of W against up to 4 activation rows at a time, with AVX512-BF16 dot products (vdpbf16ps) on the
 * weights as stored:
 * - bf16: the bits are the operands;
 * - int4: nibble pairs are spread into bf16 lanes as 128 + q (0x4300 | q is exactly 128 + q in bf16) by one
 *   multishift and one ternary-logic op; the 128 + zero offset comes back as one scalar per group, zero * scale *
 *   sum(x over the group), so each chunk costs 4 shuffles and 4 dot products per 128 weights;
 * - fp4: the same nibble pairs through a 16-entry bf16 table (e2m1 values are exact in bf16);
 * - fp8: bytes through a 128-entry bf16 table of e4m3 magnitudes (all exact, normal bf16 numbers) plus the sign.
 * Scales are applied once per chunk or block on the fp32 partial sums. Int4 and fp4 read activations permuted per
 * 128-column chunk to match the multishift order (ft_prepare_a), so no shuffle touches x in the inner loop.
 * Every activation row gets the same instruction sequence whatever the block size, so results do not depend on
 * how many tokens share the call. */
#include <math.h>
#include <string.h>
#include "rows_avx512.h"

#if defined(__AVX512BF16__) && defined(__AVX512VBMI__) && defined(__AVX512BW__) && !defined(FT_NO_AVX512)
#include <immintrin.h>

int ft_path_a_built(void) { return 1; }

int ft_path_a_supports(const ft_matrix *m) {
    switch (m->kind) {
    case FT_BF16: return m->cols % 32 == 0 ? FT_PATH_A_NATURAL : FT_PATH_B;
    case FT_INT4:
    case FT_FP4:
        if (m->g_idx || m->cols % 2) return FT_PATH_B;
        if (m->group % 128 == 0 || m->group == 16 || m->group == 32 || m->group == 64) return FT_PATH_A_PERMUTED;
        return FT_PATH_B;
    case FT_FP8: return (m->cols % 32 == 0 && m->group % 32 == 0) ? FT_PATH_A_NATURAL : FT_PATH_B;
    default: return FT_PATH_B;
    }
}

static inline int64_t kpad_of(const ft_matrix *m) { return ((int64_t)m->cols + 127) / 128 * 128; }

void ft_prepare_a(const ft_matrix *m, int path, const void *x, int64_t x_stride, const int32_t *rows, int n,
                  int first, int count, void *buf, ft_acts *a) {
    const int K = m->cols;
    const int64_t kpad = kpad_of(m);
    uint16_t *xb = (uint16_t *)buf;
    a->kpad = (int32_t)kpad;
    a->xb = xb;
    for (int i = first; i < first + count; i++) {
        const uint16_t *src = (const uint16_t *)x + (int64_t)(rows ? rows[i] : i) * x_stride;
        uint16_t *dst = xb + (int64_t)i * kpad;
        if (path == FT_PATH_A_NATURAL) {
            memcpy(dst, src, (size_t)K * 2);
            memset(dst + K, 0, (size_t)(kpad - K) * 2);
            continue;
        }
        for (int64_t c = 0; c < kpad; c += 128)
            for (int p = 0; p < 4; p++)
                for (int d = 0; d < 16; d++)
                    for (int j = 0; j < 2; j++) {
                        int64_t k = c + 16 * (d / 2) + 4 * p + 2 * (d % 2) + j;
                        dst[c + 32 * p + 2 * d + j] = k < K ? src[k] : 0;
                    }
    }
    if (m->kind != FT_INT4) return;
    const int G = m->group, ng = K / G;
    float *xs = (float *)(xb + (int64_t)n * kpad + 32); /* 64-byte gap */
    a->xsum = xs;
    a->ngroups = ng;
    for (int i = first; i < first + count; i++) {
        const uint16_t *src = (const uint16_t *)x + (int64_t)(rows ? rows[i] : i) * x_stride;
        for (int g = 0; g < ng; g++) {
            float s = 0.0f;
            for (int k = g * G; k < (g + 1) * G; k++) s += ft_bf16_to_f32(src[k]);
            xs[(int64_t)i * ng + g] = s;
        }
    }
}

#define DP(acc, w, x) _mm512_dpbf16_ps((acc), (__m512bh)(w), (__m512bh)_mm512_loadu_si512(x))
/* software prefetch this many bytes ahead in the decode kernels: the hardware prefetcher alone leaves the int4
 * kernel's loads waiting on memory (rows of a matrix are contiguous, so this runs ahead into the next rows) */
#ifndef FT_PREFETCH_BYTES
#define FT_PREFETCH_BYTES 8192
#endif
#ifndef FT_DECODE_ROWS4
#define FT_DECODE_ROWS4 1
#endif

/* bf16 weights, natural activations */
static inline __attribute__((always_inline)) void bf16_block(const uint16_t *w, int steps, const uint16_t **x,
                                                             float *y, const int NT) {
    __m512 acc[4][2];
    for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    const int pf = ft_row_prefetch;
    int s = 0;
    for (; s + 2 <= steps; s += 2) {
        if (pf) { /* both lines of this step's 128 bytes, pf bytes on (into the next rows) */
            _mm_prefetch((const char *)(w + 32 * s) + pf, _MM_HINT_T1);
            _mm_prefetch((const char *)(w + 32 * s) + pf + 64, _MM_HINT_T1);
        }
        __m512i w0 = _mm512_loadu_si512(w + 32 * s), w1 = _mm512_loadu_si512(w + 32 * s + 32);
        for (int t = 0; t < NT; t++) {
            acc[t][0] = DP(acc[t][0], w0, x[t] + 32 * s);
            acc[t][1] = DP(acc[t][1], w1, x[t] + 32 * s + 32);
        }
    }
    if (s < steps) {
        __m512i w0 = _mm512_loadu_si512(w + 32 * s);
        for (int t = 0; t < NT; t++) acc[t][0] = DP(acc[t][0], w0, x[t] + 32 * s);
    }
    for (int t = 0; t < NT; t++) y[t] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]));
}

/* two rows of bf16 weights against NT activation rows: each (row, activation row) pair accumulates exactly as
 * bf16_block's does (two accumulators alternating by step), with one weight load feeding NT products */
static inline __attribute__((always_inline)) void bf16_tile(const uint16_t *w0, const uint16_t *w1, int steps,
                                                            const uint16_t **x, float *y0, float *y1, const int NT) {
    __m512 acc[2][4][2];
    for (int t = 0; t < NT; t++)
        for (int p = 0; p < 2; p++) acc[0][t][p] = acc[1][t][p] = _mm512_setzero_ps();
    int s = 0;
    for (; s + 2 <= steps; s += 2) {
        const __m512i a0 = _mm512_loadu_si512(w0 + 32 * s), b0 = _mm512_loadu_si512(w0 + 32 * s + 32);
        const __m512i a1 = _mm512_loadu_si512(w1 + 32 * s), b1 = _mm512_loadu_si512(w1 + 32 * s + 32);
        for (int t = 0; t < NT; t++) {
            const __m512i xa = _mm512_loadu_si512(x[t] + 32 * s), xb = _mm512_loadu_si512(x[t] + 32 * s + 32);
            acc[0][t][0] = _mm512_dpbf16_ps(acc[0][t][0], (__m512bh)a0, (__m512bh)xa);
            acc[0][t][1] = _mm512_dpbf16_ps(acc[0][t][1], (__m512bh)b0, (__m512bh)xb);
            acc[1][t][0] = _mm512_dpbf16_ps(acc[1][t][0], (__m512bh)a1, (__m512bh)xa);
            acc[1][t][1] = _mm512_dpbf16_ps(acc[1][t][1], (__m512bh)b1, (__m512bh)xb);
        }
    }
    if (s < steps) {
        const __m512i a0 = _mm512_loadu_si512(w0 + 32 * s), a1 = _mm512_loadu_si512(w1 + 32 * s);
        for (int t = 0; t < NT; t++) {
            const __m512i xa = _mm512_loadu_si512(x[t] + 32 * s);
            acc[0][t][0] = _mm512_dpbf16_ps(acc[0][t][0], (__m512bh)a0, (__m512bh)xa);
            acc[1][t][0] = _mm512_dpbf16_ps(acc[1][t][0], (__m512bh)a1, (__m512bh)xa);
        }
    }
    for (int t = 0; t < NT; t++) {
        y0[t] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][t][0], acc[0][t][1]));
        y1[t] = _mm512_reduce_add_ps(_mm512_add_ps(acc[1][t][0], acc[1][t][1]));
    }
}

static __m512i CTL[4];      /* multishift controls: step p, dword 2q + h <- nibbles 16q + 4p + 2h, +1 */
static __m512i E4M3_LUT[4]; /* bf16 bits of e4m3 magnitudes 0..127, 32 per register */

__attribute__((constructor)) static void init_tables(void) {
    for (int p = 0; p < 4; p++) {
        uint64_t v = 0;
        for (int h = 0; h < 2; h++) {
            v |= (uint64_t)(4 * (4 * p + 2 * h)) << (8 * (4 * h));
            v |= (uint64_t)(4 * (4 * p + 2 * h + 1)) << (8 * (4 * h + 2));
        }
        CTL[p] = _mm512_set1_epi64((long long)v);
    }
    uint16_t lut[128];
    for (int b = 0; b < 128; b++) {
        int e = (b >> 3) & 0xf, mant = b & 7;
        float v = e ? ldexpf(1.0f + mant / 8.0f, e - 7) : ldexpf(mant / 8.0f, -6);
        lut[b] = b == 0x7f ? 0x7fc0 : ft_f32_to_bf16(v);
    }
    for (int i = 0; i < 4; i++) E4M3_LUT[i] = _mm512_loadu_si512(lut + 32 * i);
}

/* lane d of a chunk's scale vector reads scale (16 * (d / 2)) / G of the chunk: d >> 1, 2, 3 for G = 16, 32, 64 */
static inline __m512i lane_groups(int G) {
    const int shift = G == 16 ? 1 : G == 32 ? 2 : 3;
    return _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), shift);
}

/* 64 bytes of nibbles -> four registers of 32 bf16 weights each: int4 as 128 + q (the magic 0x4300 | q, the offset
 * taken off later through the zero sums), fp4 through its e2m1 table */
static inline __attribute__((always_inline)) void nibble_unpack(__m512i src, const int FP4, __m512i w[4]) {
    const __m512i M = _mm512_set1_epi32(0x000F000F), C = _mm512_set1_epi32(0x43004300);
    const __m512i LUT = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                         (short)0xc0c0, (short)0xc080, (short)0xc040, (short)0xc000, (short)0xbfc0,
                                         (short)0xbf80, (short)0xbf00, (short)0x8000, 0x40c0, 0x4080, 0x4040, 0x4000,
                                         0x3fc0, 0x3f80, 0x3f00, 0x0000);
    for (int p = 0; p < 4; p++) {
        __m512i ms = _mm512_multishift_epi64_epi8(CTL[p], src);
        w[p] = FP4 ? _mm512_permutexvar_epi16(_mm512_and_si512(ms, M), LUT)
                   : _mm512_ternarylogic_epi32(ms, M, C, 0xEA); /* (ms & M) | C */
    }
}

/* the unscaled dot product of one 128-column chunk's weights w with activations xc (two chains, then their sum) */
static inline __attribute__((always_inline)) __m512 chunk_dot(const __m512i w[4], const uint16_t *xc) {
    __m512 a = DP(_mm512_setzero_ps(), w[0], xc), b = DP(_mm512_setzero_ps(), w[1], xc + 32);
    a = DP(a, w[2], xc + 64);
    b = DP(b, w[3], xc + 96);
    return _mm512_add_ps(a, b);
}

/* int4 (FP4 = 0) or fp4 (FP4 = 1) nibbles against NT permuted activation rows -> y[NT]; partial sums are scaled per
 * 128-column chunk and (int4) the 128 + zero offsets, zs[g] * xsum[t][g], come off before the one horizontal sum */
static inline __attribute__((always_inline)) void nibble_block(const uint8_t *q, int cols, int G, const float *sc,
                                                               const float *zs, int ng, const uint16_t **x,
                                                               const float **xs, float *y, const int NT,
                                                               const int FP4) {
    const __m512i lanes = lane_groups(G);
    const int bytes = cols / 2, wide = G % 128 == 0, per_scale = wide ? G / 128 : 1, step = wide ? 1 : 128 / G;
    __m512 tot[4];
    for (int t = 0; t < NT; t++) tot[t] = _mm512_setzero_ps();
    for (int c = 0, si = 0, left_in_scale = per_scale; 64 * c < bytes; c++) {
        int left = bytes - 64 * c;
        __m512i src = left >= 64 ? _mm512_loadu_si512(q + 64 * c)
                                 : _mm512_maskz_loadu_epi8((__mmask64)((1ull << left) - 1), q + 64 * c);
        __m512 sv = wide ? _mm512_set1_ps(sc[si]) : _mm512_permutexvar_ps(lanes, _mm512_loadu_ps(sc + si));
        if (--left_in_scale == 0) si += step, left_in_scale = per_scale;
        __m512i w[4];
        nibble_unpack(src, FP4, w);
        for (int t = 0; t < NT; t++) tot[t] = _mm512_fmadd_ps(sv, chunk_dot(w, x[t] + 128 * c), tot[t]);
    }
    if (!FP4)
        for (int g = 0; g < ng; g += 16) {
            __mmask16 k = ng - g >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (ng - g)) - 1);
            __m512 z = _mm512_maskz_loadu_ps(k, zs + g);
            for (int t = 0; t < NT; t++) tot[t] = _mm512_fnmadd_ps(z, _mm512_maskz_loadu_ps(k, xs[t] + g), tot[t]);
        }
    for (int t = 0; t < NT; t++) y[t] = _mm512_reduce_add_ps(tot[t]);
}

/* decode: R rows of int4 / fp4 against one activation row (each row's arithmetic exactly nibble_block's with NT = 1:
 * more independent chains in flight and one set of x loads for R rows) */
static inline __attribute__((always_inline)) void nibble_rows_1(const uint8_t *q, int64_t row_bytes, int cols,
                                                                int G, const float *sc, const float *zs, int ng,
                                                                const uint16_t *x, const float *xs, float *y,
                                                                int ldy, const int R, const int FP4) {
    const __m512i lanes = lane_groups(G);
    const int bytes = cols / 2, wide = G % 128 == 0, per_scale = wide ? G / 128 : 1, step = wide ? 1 : 128 / G;
    __m512 tot[4];
    for (int r = 0; r < R; r++) tot[r] = _mm512_setzero_ps();
    for (int c = 0, si = 0, left_in_scale = per_scale; 64 * c < bytes; c++) {
        const int left = bytes - 64 * c;
        const __mmask64 km = left >= 64 ? ~(__mmask64)0 : (__mmask64)((1ull << left) - 1);
        const uint16_t *xc = x + 128 * c;
        for (int r = 0; r < R; r++) {
            const uint8_t *qr = q + r * row_bytes + 64 * c;
            _mm_prefetch((const char *)(qr + FT_PREFETCH_BYTES), _MM_HINT_T1); /* rows to come */
            __m512i src = left >= 64 ? _mm512_loadu_si512(qr) : _mm512_maskz_loadu_epi8(km, qr);
            const float *scr = sc + (int64_t)r * ng;
            __m512 sv = wide ? _mm512_set1_ps(scr[si]) : _mm512_permutexvar_ps(lanes, _mm512_loadu_ps(scr + si));
            __m512i w[4];
            nibble_unpack(src, FP4, w);
            tot[r] = _mm512_fmadd_ps(sv, chunk_dot(w, xc), tot[r]);
        }
        if (--left_in_scale == 0) si += step, left_in_scale = per_scale;
    }
    if (!FP4)
        for (int g = 0; g < ng; g += 16) {
            __mmask16 k = ng - g >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (ng - g)) - 1);
            __m512 xv = _mm512_maskz_loadu_ps(k, xs + g);
            for (int r = 0; r < R; r++)
                tot[r] = _mm512_fnmadd_ps(_mm512_maskz_loadu_ps(k, zs + (int64_t)r * ng + g), xv, tot[r]);
        }
    for (int r = 0; r < R; r++) y[(int64_t)r * ldy] = _mm512_reduce_add_ps(tot[r]);
}

/* fp8 e4m3 bytes, natural activations, one scale per block of G columns */
static inline __attribute__((always_inline)) void fp8_block(const uint8_t *q, int cols, int G, const float *sc,
                                                            const uint16_t **x, float *y, const int NT) {
    const __m512i B6 = _mm512_set1_epi16(0x40), SIGN = _mm512_set1_epi16((short)0x8000);
    __m512 tot[4], acc[4][2];
    for (int t = 0; t < NT; t++) tot[t] = _mm512_setzero_ps();
    const int per_block = (G < cols ? G : cols) / 32, steps = cols / 32;
    for (int s0 = 0, b = 0; s0 < steps; s0 += per_block, b++) {
        for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
        for (int s = s0; s < s0 + per_block && s < steps; s++) {
            __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * s)));
            __mmask32 hi = _mm512_test_epi16_mask(v, B6);
            __m512i r = _mm512_mask_blend_epi16(hi, _mm512_permutex2var_epi16(E4M3_LUT[0], v, E4M3_LUT[1]),
                                                _mm512_permutex2var_epi16(E4M3_LUT[2], v, E4M3_LUT[3]));
            r = _mm512_ternarylogic_epi32(r, _mm512_slli_epi16(v, 8), SIGN, 0xF8); /* r | (v << 8 & sign) */
            for (int t = 0; t < NT; t++) acc[t][s & 1] = DP(acc[t][s & 1], r, x[t] + 32 * s);
        }
        __m512 scale = _mm512_set1_ps(sc[b]);
        for (int t = 0; t < NT; t++) tot[t] = _mm512_fmadd_ps(scale, _mm512_add_ps(acc[t][0], acc[t][1]), tot[t]);
    }
    for (int t = 0; t < NT; t++) y[t] = _mm512_reduce_add_ps(tot[t]);
}

static inline const uint16_t *act(const ft_acts *a, const int32_t *idx, int i) {
    return a->xb + (int64_t)(idx ? idx[i] : i) * a->kpad;
}

/* one row against n activation rows, 4 at a time; sc: the row's scales, zs: its zero offsets (int4) */
static inline void nibble_row(const ft_matrix *m, const uint8_t *q, const float *sc, const float *zs,
                              const ft_acts *a, const int32_t *idx, int n, float *y) {
    const int G = m->group, ng = m->scale_cols;
    for (int i = 0; i < n; i += 4) {
        int nt = n - i < 4 ? n - i : 4;
        const uint16_t *x[4];
        const float *xs[4];
        for (int t = 0; t < nt; t++) {
            const int64_t r = idx ? idx[i + t] : i + t;
            x[t] = a->xb + r * a->kpad;
            xs[t] = a->xsum ? a->xsum + r * a->ngroups : NULL;
        }
#define NIB(NT, FP4) nibble_block(q, m->cols, G, sc, zs, ng, x, xs, y + i, NT, FP4)
        if (m->kind == FT_FP4)
            switch (nt) { case 1: NIB(1, 1); break; case 2: NIB(2, 1); break; case 3: NIB(3, 1); break; default: NIB(4, 1); }
        else
            switch (nt) { case 1: NIB(1, 0); break; case 2: NIB(2, 0); break; case 3: NIB(3, 0); break; default: NIB(4, 0); }
#undef NIB
    }
}

static void dense_rows(const ft_matrix *m, const uint8_t *q, const ft_acts *a, const int32_t *idx, int n,
                       float *y) {
    for (int i = 0; i < n; i += 4) {
        int nt = n - i < 4 ? n - i : 4;
        const uint16_t *x[4];
        for (int t = 0; t < nt; t++) x[t] = act(a, idx, i + t);
        if (m->kind == FT_BF16) {
            const uint16_t *w = (const uint16_t *)q;
            switch (nt) {
            case 1: bf16_block(w, m->cols / 32, x, y + i, 1); break;
            case 2: bf16_block(w, m->cols / 32, x, y + i, 2); break;
            case 3: bf16_block(w, m->cols / 32, x, y + i, 3); break;
            default: bf16_block(w, m->cols / 32, x, y + i, 4);
            }
        }
    }
}

void ft_rows_dot_a(const ft_matrix *m, int e, int r0, int r1, const ft_acts *a, const int32_t *idx, int n,
                   float *y, int ldy, float *scratch) {
    const uint8_t *base = m->data + (int64_t)e * m->data_stride;
    if (m->kind == FT_BF16) {
        int r = r0;
        if (n >= 8) /* compute-bound: two weight rows at a time, each load feeding up to 8 products (fewer rows stream
                     * one weight row at a time: interleaved rows slow the hardware prefetcher) */
            for (; r + 2 <= r1; r += 2) {
                const uint16_t *w0 = (const uint16_t *)(base + (int64_t)r * m->row_bytes);
                const uint16_t *w1 = (const uint16_t *)(base + (int64_t)(r + 1) * m->row_bytes);
                float *y0 = y + (int64_t)(r - r0) * ldy, *y1 = y0 + ldy;
                for (int i = 0; i < n; i += 4) {
                    const int nt = n - i < 4 ? n - i : 4;
                    const uint16_t *x[4];
                    for (int t = 0; t < nt; t++) x[t] = act(a, idx, i + t);
                    switch (nt) {
                    case 1: bf16_tile(w0, w1, m->cols / 32, x, y0 + i, y1 + i, 1); break;
                    case 2: bf16_tile(w0, w1, m->cols / 32, x, y0 + i, y1 + i, 2); break;
                    case 3: bf16_tile(w0, w1, m->cols / 32, x, y0 + i, y1 + i, 3); break;
                    default: bf16_tile(w0, w1, m->cols / 32, x, y0 + i, y1 + i, 4);
                    }
                }
            }
        for (; r < r1; r++) dense_rows(m, base + (int64_t)r * m->row_bytes, a, idx, n, y + (int64_t)(r - r0) * ldy);
        return;
    }
    if (m->kind == FT_FP8) {
        const float *s = (const float *)(m->scales + (int64_t)e * m->scales_stride);
        for (int r = r0; r < r1; r++) {
            const uint8_t *q = base + (int64_t)r * m->row_bytes;
            const float *sc = s + (int64_t)(r / m->block_rows) * m->scale_cols;
            float *yr = y + (int64_t)(r - r0) * ldy;
            for (int i = 0; i < n; i += 4) {
                int nt = n - i < 4 ? n - i : 4;
                const uint16_t *x[4];
                for (int t = 0; t < nt; t++) x[t] = act(a, idx, i + t);
                switch (nt) {
                case 1: fp8_block(q, m->cols, m->group, sc, x, yr + i, 1); break;
                case 2: fp8_block(q, m->cols, m->group, sc, x, yr + i, 2); break;
                case 3: fp8_block(q, m->cols, m->group, sc, x, yr + i, 3); break;
                default: fp8_block(q, m->cols, m->group, sc, x, yr + i, 4);
                }
            }
        }
        return;
    }
    /* int4 / fp4: scales (and zero offsets) of a block of rows at a time, then the rows */
    const int ng = m->scale_cols;
    const int tail = m->cols % 128 != 0 && m->group < 128; /* lanes past the last column read padding */
    float *sc = scratch, *zs = sc + (int64_t)FT_ROW_BLOCK * ng + 32, *pad = zs + (int64_t)FT_ROW_BLOCK * ng;
    for (int b0 = r0; b0 < r1; b0 += FT_ROW_BLOCK) {
        const int b1 = b0 + FT_ROW_BLOCK < r1 ? b0 + FT_ROW_BLOCK : r1;
        ft_prefetch_scales(m, e, b1, b1 + FT_ROW_BLOCK); /* the next block's, past r1 too: the MoE layer asks one
                                                           * block per call */
        ft_scales_block(m, e, b0, b1, sc);
        memset(sc + (int64_t)(b1 - b0) * ng, 0, 32 * 4);
        if (m->kind == FT_INT4) {
            const uint8_t *z = m->zeros + (int64_t)e * m->zeros_stride + (int64_t)b0 * ng;
            for (int64_t i = 0; i < (int64_t)(b1 - b0) * ng; i++) zs[i] = sc[i] * (128.0f + (float)z[i]);
        }
        int r = b0;
        if (FT_DECODE_ROWS4 && n == 1 && !tail) /* decode: four rows at a time */
            for (; r + 4 <= b1; r += 4) {
                const int64_t t0 = idx ? idx[0] : 0;
                const uint16_t *x = a->xb + t0 * a->kpad;
                const float *xs = a->xsum ? a->xsum + t0 * a->ngroups : NULL;
                float *yr = y + (int64_t)(r - r0) * ldy;
                const float *scr = sc + (int64_t)(r - b0) * ng, *zsr = zs + (int64_t)(r - b0) * ng;
                if (m->kind == FT_FP4)
                    nibble_rows_1(base + (int64_t)r * m->row_bytes, m->row_bytes, m->cols, m->group, scr, zsr, ng,
                                  x, xs, yr, ldy, 4, 1);
                else
                    nibble_rows_1(base + (int64_t)r * m->row_bytes, m->row_bytes, m->cols, m->group, scr, zsr, ng,
                                  x, xs, yr, ldy, 4, 0);
            }
        for (; r < b1; r++) {
            const float *scr = sc + (int64_t)(r - b0) * ng;
            if (tail) {
                memcpy(pad, scr, (size_t)ng * 4);
                memset(pad + ng, 0, 16 * 4);
                scr = pad;
            }
            nibble_row(m, base + (int64_t)r * m->row_bytes, scr, zs + (int64_t)(r - b0) * ng, a, idx, n,
                       y + (int64_t)(r - r0) * ldy);
        }
    }
}

#else /* no AVX512-BF16 at build time: path B only */

int ft_path_a_built(void) { return 0; }
int ft_path_a_supports(const ft_matrix *m) { (void)m; return FT_PATH_B; }
void ft_prepare_a(const ft_matrix *m, int path, const void *x, int64_t x_stride, const int32_t *rows, int n,
                  int first, int count, void *buf, ft_acts *a) {
    (void)m; (void)path; (void)x; (void)x_stride; (void)rows; (void)n; (void)buf; (void)a;
}
void ft_rows_dot_a(const ft_matrix *m, int e, int r0, int r1, const ft_acts *a, const int32_t *idx, int n,
                   float *y, int ldy, float *scratch) {
    (void)m; (void)e; (void)r0; (void)r1; (void)a; (void)idx; (void)n; (void)y; (void)ldy; (void)scratch;
}
#endif
