/* Path A8: int4 weights against int8 activations with AVX512-VNNI dot products (vpdpbusd: 64 u8 x s8 products per
 * instruction), as llama.cpp runs its 4-bit types against Q8 activations.
 *
 * Activations are quantized per 32-column block (scale = max |x| / 127, round to nearest) and laid out per 128-column
 * chunk as the even columns then the odd ones, so the low and the high nibbles of 64 packed bytes meet their
 * activations with no shuffle: 3 ops split the nibbles, 2 dot products take 128 weights, and one multiply-add per
 * chunk applies the weight scale times each lane's activation scale. The zero point comes off once per group
 * (zero * scale * sum of the quantized activations). Against the bf16 path this trades the activations' bf16 rounding
 * for an 8-bit one per block; every activation row still gets the same instruction sequence whatever the batch. */
#include <math.h>
#include <string.h>
#include "rows_avx512.h"
#ifndef FT_PREFETCH_BYTES
#define FT_PREFETCH_BYTES 8192
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && !defined(FT_NO_AVX512)
#include <immintrin.h>

int ft_path_a8_built(void) { return 1; }

int ft_q8_supports(const ft_matrix *m) {
    return m->kind == FT_INT4 && !m->g_idx && m->cols % 2 == 0 &&
           (m->group % 128 == 0 || m->group == 32 || m->group == 64);
}

static inline int64_t kpad_of(const ft_matrix *m) { return ((int64_t)m->cols + 127) / 128 * 128; }

int64_t ft_q8_acts_bytes(const ft_matrix *m, int n) {
    const int64_t kpad = kpad_of(m);
    return (int64_t)n * kpad + 64 + (int64_t)n * (kpad / 128 * 16) * 4 + 64 + (int64_t)n * (m->cols / m->group) * 4;
}

void ft_prepare_q8(const ft_matrix *m, const void *x, int64_t x_stride, const int32_t *rows, int n, int first,
                   int count, void *buf, ft_acts *a) {
    const int K = m->cols, G = m->group, ng = K / G;
    const int64_t kpad = kpad_of(m), lanes = kpad / 128 * 16;
    int8_t *xq = (int8_t *)buf;
    float *xl = (float *)((uint8_t *)buf + ((n * kpad + 63) / 64 * 64 + 64));
    float *xs = xl + ((n * lanes + 15) / 16 * 16 + 16);
    a->kpad = (int32_t)kpad;
    a->xq = xq;
    a->xlane = xl;
    a->xsum = xs;
    a->ngroups = ng;
    float v[128], sc[4];
    for (int i = first; i < first + count; i++) {
        const uint16_t *src = (const uint16_t *)x + (int64_t)(rows ? rows[i] : i) * x_stride;
        int8_t *q = xq + (int64_t)i * kpad;
        float *deq = NULL; /* the quantized values times their scale, for the zero-point sums */
        float dq[128];
        for (int64_t c = 0; c < kpad; c += 128) {
            for (int k = 0; k < 128; k++) v[k] = c + k < K ? ft_bf16_to_f32(src[c + k]) : 0.0f;
            for (int b = 0; b < 4; b++) {
                float mx = 0.0f;
                for (int k = 32 * b; k < 32 * b + 32; k++) mx = fmaxf(mx, fabsf(v[k]));
                sc[b] = mx > 0.0f ? mx / 127.0f : 0.0f;
                const float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
                for (int k = 32 * b; k < 32 * b + 32; k++) {
                    const float r = nearbyintf(v[k] * inv);
                    const int8_t qi = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : r);
                    dq[k] = (float)qi * sc[b];
                    if (k % 2 == 0) q[c + k / 2] = qi;
                    else q[c + 64 + k / 2] = qi;
                }
            }
            for (int d = 0; d < 16; d++) xl[(int64_t)i * lanes + c / 8 + d] = sc[d / 4];
            deq = dq;
            for (int k = 0; k < 128 && c + k < K; k++)
                if ((c + k) % G == 0) xs[(int64_t)i * ng + (c + k) / G] = 0.0f;
            for (int k = 0; k < 128 && c + k < K; k++) xs[(int64_t)i * ng + (c + k) / G] += deq[k];
        }
    }
}

static inline __m512i lane_groups(int G) {
    const int shift = G == 32 ? 2 : 3;
    return _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), shift);
}

/* R rows x NT activation rows (R * NT <= 4): per 128-col chunk the nibbles split once per row, two dot products per
 * (row, activation row), one multiply-add of (weight scale x lane scale) */
static inline __attribute__((always_inline)) void q8_tile(const uint8_t *q, int64_t row_bytes, int cols, int G,
                                                          const float *sc, const float *zs, int ng,
                                                          const int8_t **xq, const float **xl, const float **xs,
                                                          float *y, int64_t ldy, const int R, const int NT) {
    const __m512i LO = _mm512_set1_epi8(0x0F);
    const __m512i lanes = lane_groups(G);
    const int bytes = cols / 2, wide = G % 128 == 0, per_scale = wide ? G / 128 : 1, step = wide ? 1 : 128 / G;
    __m512 tot[4][4];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) tot[r][t] = _mm512_setzero_ps();
    for (int c = 0, si = 0, left_in_scale = per_scale; 64 * c < bytes; c++) {
        const int left = bytes - 64 * c;
        const __mmask64 km = left >= 64 ? ~(__mmask64)0 : (__mmask64)((1ull << left) - 1);
        __m512i xe[4], xo[4];
        __m512 xsl[4];
        for (int t = 0; t < NT; t++) {
            xe[t] = _mm512_loadu_si512(xq[t] + 128 * c);
            xo[t] = _mm512_loadu_si512(xq[t] + 128 * c + 64);
            xsl[t] = _mm512_loadu_ps(xl[t] + 16 * c);
        }
        for (int r = 0; r < R; r++) {
            const uint8_t *qr = q + r * row_bytes + 64 * c;
            _mm_prefetch((const char *)(qr + FT_PREFETCH_BYTES), _MM_HINT_T1);
            const __m512i src = left >= 64 ? _mm512_loadu_si512(qr) : _mm512_maskz_loadu_epi8(km, qr);
            const __m512i lo = _mm512_and_si512(src, LO), hi = _mm512_and_si512(_mm512_srli_epi16(src, 4), LO);
            const float *scr = sc + (int64_t)r * ng;
            const __m512 sw = wide ? _mm512_set1_ps(scr[si]) : _mm512_permutexvar_ps(lanes, _mm512_loadu_ps(scr + si));
            for (int t = 0; t < NT; t++) {
                __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xe[t]);
                acc = _mm512_dpbusd_epi32(acc, hi, xo[t]);
                tot[r][t] = _mm512_fmadd_ps(_mm512_mul_ps(sw, xsl[t]), _mm512_cvtepi32_ps(acc), tot[r][t]);
            }
        }
        if (--left_in_scale == 0) si += step, left_in_scale = per_scale;
    }
    for (int g = 0; g < ng; g += 16) { /* the zero points: zero * scale * sum of the group's activations */
        const __mmask16 k = ng - g >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (ng - g)) - 1);
        for (int t = 0; t < NT; t++) {
            const __m512 xv = _mm512_maskz_loadu_ps(k, xs[t] + g);
            for (int r = 0; r < R; r++)
                tot[r][t] = _mm512_fnmadd_ps(_mm512_maskz_loadu_ps(k, zs + (int64_t)r * ng + g), xv, tot[r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) y[r * ldy + t] = _mm512_reduce_add_ps(tot[r][t]);
}

void ft_rows_dot_q8(const ft_matrix *m, int e, int r0, int r1, const ft_acts *a, const int32_t *idx, int n, float *y,
                    int ldy, float *scratch) {
    const uint8_t *base = m->data + (int64_t)e * m->data_stride;
    const int ng = m->scale_cols;
    const int tail = m->cols % 128 != 0 && m->group < 128;
    float *sc = scratch, *zs = sc + (int64_t)FT_ROW_BLOCK * ng + 32, *pad = zs + (int64_t)FT_ROW_BLOCK * ng;
    const int8_t *xq[4];
    const float *xl[4], *xs[4];
    for (int b0 = r0; b0 < r1; b0 += FT_ROW_BLOCK) {
        const int b1 = b0 + FT_ROW_BLOCK < r1 ? b0 + FT_ROW_BLOCK : r1;
        ft_scales_block(m, e, b0, b1, sc);
        memset(sc + (int64_t)(b1 - b0) * ng, 0, 32 * 4);
        const uint8_t *z = m->zeros + (int64_t)e * m->zeros_stride + (int64_t)b0 * ng;
        for (int64_t i = 0; i < (int64_t)(b1 - b0) * ng; i++) zs[i] = sc[i] * (float)z[i];
        int r = b0;
        if (n == 1 && !tail) { /* decode: four rows at a time */
            const int64_t t0 = idx ? idx[0] : 0;
            xq[0] = a->xq + t0 * a->kpad, xl[0] = a->xlane + t0 * (a->kpad / 8), xs[0] = a->xsum + t0 * a->ngroups;
            for (; r + 4 <= b1; r += 4)
                q8_tile(base + (int64_t)r * m->row_bytes, m->row_bytes, m->cols, m->group,
                        sc + (int64_t)(r - b0) * ng, zs + (int64_t)(r - b0) * ng, ng, xq, xl, xs,
                        y + (int64_t)(r - r0) * ldy, ldy, 4, 1);
        }
        for (; r < b1; r++) {
            const float *scr = sc + (int64_t)(r - b0) * ng;
            if (tail) {
                memcpy(pad, scr, (size_t)ng * 4);
                memset(pad + ng, 0, 16 * 4);
                scr = pad;
            }
            for (int i = 0; i < n; i += 4) {
                const int nt = n - i < 4 ? n - i : 4;
                for (int t = 0; t < nt; t++) {
                    const int64_t row = idx ? idx[i + t] : i + t;
                    xq[t] = a->xq + row * a->kpad, xl[t] = a->xlane + row * (a->kpad / 8);
                    xs[t] = a->xsum + row * a->ngroups;
                }
                const uint8_t *qr = base + (int64_t)r * m->row_bytes;
                float *yr = y + (int64_t)(r - r0) * ldy + i;
                const float *zr = zs + (int64_t)(r - b0) * ng;
                switch (nt) {
                case 1: q8_tile(qr, m->row_bytes, m->cols, m->group, scr, zr, ng, xq, xl, xs, yr, ldy, 1, 1); break;
                case 2: q8_tile(qr, m->row_bytes, m->cols, m->group, scr, zr, ng, xq, xl, xs, yr, ldy, 1, 2); break;
                case 3: q8_tile(qr, m->row_bytes, m->cols, m->group, scr, zr, ng, xq, xl, xs, yr, ldy, 1, 3); break;
                default: q8_tile(qr, m->row_bytes, m->cols, m->group, scr, zr, ng, xq, xl, xs, yr, ldy, 1, 4);
                }
            }
        }
    }
}

#else

int ft_path_a8_built(void) { return 0; }
int ft_q8_supports(const ft_matrix *m) { (void)m; return 0; }
int64_t ft_q8_acts_bytes(const ft_matrix *m, int n) { (void)m; (void)n; return 0; }
void ft_prepare_q8(const ft_matrix *m, const void *x, int64_t x_stride, const int32_t *rows, int n, int first,
                   int count, void *buf, ft_acts *a) {
    (void)m; (void)x; (void)x_stride; (void)rows; (void)n; (void)first; (void)count; (void)buf; (void)a;
}
void ft_rows_dot_q8(const ft_matrix *m, int e, int r0, int r1, const ft_acts *a, const int32_t *idx, int n, float *y,
                    int ldy, float *scratch) {
    (void)m; (void)e; (void)r0; (void)r1; (void)a; (void)idx; (void)n; (void)y; (void)ldy; (void)scratch;
}
#endif
