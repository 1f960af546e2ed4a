/* Path Q: int4 weights against activations quantized to int8 per unit of U = min(group, 128) columns
 * (d = max|x| / 127 over the unit, a = round(x / d)), with AVX512-VNNI: vpdpbusd multiplies the unsigned nibbles by
 * the signed int8 activations, four products per int32 lane, so a 128-column chunk costs three logic ops and two dot
 * instructions where path A's bf16 route needs eight unpack ops and four dots (path A is instruction-bound on int4,
 * this one reaches memory speed). The rule is llama.cpp's Q4_0 x Q8_0 dot with a unit of up to 128 columns; the
 * result equals the dequantized weights times the dequantized activations (freetoken.host.kernels.int8_acts_ref)
 * up to fp32 summation order:
 *   y = sum_u s_u d_u (sum_{k in u} a_k q_k) - s_u z_u d_u (sum_{k in u} a_k)
 * Activations are laid out per 128-column chunk as its 64 even columns, then its 64 odd ones: byte b of a weight row
 * holds columns 2b (low nibble) and 2b + 1 (high), so the low-nibble register meets the even columns lane for lane.
 * Int8 weights (an LM head quantized at load) take the same route with a byte per weight in natural column order,
 * so their activations stay in natural order too: a chunk is two plain 64-byte loads and the same two dots.
 * Every activation row gets the same instruction sequence whatever the batch, so a token's result does not depend
 * on its batch-mates. */
#include <math.h>
#include <string.h>
#include "rows_int8.h"

static int ft_int8_acts = 1;

void ft_set_int8_acts(int32_t on) { ft_int8_acts = on != 0; }

int ft_path_q_unit(const ft_matrix *m) {
    if (!ft_path_q_built() || !ft_int8_acts || m->g_idx || m->cols % 128) return 0;
    if (m->kind == FT_INT8) return m->group % 128 == 0 ? 128 : 0;
    if (m->kind != FT_INT4) return 0;
    return m->group == 16 || m->group == 32 || m->group == 64 || m->group % 128 == 0 ? ft_q_unit_of(m) : 0;
}

int64_t ft_acts_q_bytes(const ft_matrix *m, int n) {
    const int64_t units = m->cols / ft_q_unit_of(m);
    return (int64_t)n * m->cols + 2 * ((int64_t)n * units + 32) * 4 + 128;
}

#ifdef FT_Q_AVX512
#include <immintrin.h>

int ft_path_q_built(void) { return 1; }

/* one 128-column chunk of bf16 activations -> int8 (even columns, then odd; natural: in column order) with the
 * per-unit d and d * sum(a) */
static inline void quantize_chunk(const uint16_t *x, int U, int8_t *dst, float *xd, float *xza, int natural) {
    const __m512 ABS = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    __m512 v[8];
    for (int j = 0; j < 8; j++)
        v[j] = ft_bf16x16(x + 16 * j);
    const int regs = U / 16; /* registers per unit */
    __m128i q[8];
    for (int u = 0; u < 8 / regs; u++) {
        __m512 m = _mm512_setzero_ps();
        __mmask16 nan = 0;
        for (int j = u * regs; j < (u + 1) * regs; j++) {
            m = _mm512_max_ps(m, _mm512_and_ps(v[j], ABS));
            nan |= _mm512_cmp_ps_mask(v[j], v[j], _CMP_UNORD_Q);
        }
        const float amax = _mm512_reduce_max_ps(m), d = nan ? NAN : amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        __m512i sum = _mm512_setzero_si512();
        for (int j = u * regs; j < (u + 1) * regs; j++) {
            __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(v[j], _mm512_set1_ps(id))); /* nearest, ties to even */
            a = _mm512_max_epi32(_mm512_min_epi32(a, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
            sum = _mm512_add_epi32(sum, a);
            q[j] = _mm512_cvtepi32_epi8(a);
        }
        xd[u] = d;
        xza[u] = d * (float)_mm512_reduce_add_epi32(sum);
    }
    if (natural) {
        for (int j = 0; j < 8; j++) _mm_storeu_si128((__m128i *)(dst + 16 * j), q[j]);
        return;
    }
    const __m512i t0 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(q[1], q[0])), _mm256_set_m128i(q[3], q[2]), 1);
    const __m512i t1 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(q[5], q[4])), _mm256_set_m128i(q[7], q[6]), 1);
    int8_t idx[64];
    for (int i = 0; i < 64; i++) idx[i] = (int8_t)(2 * i);
    const __m512i even = _mm512_loadu_si512(idx), odd = _mm512_add_epi8(even, _mm512_set1_epi8(1));
    _mm512_storeu_si512(dst, _mm512_permutex2var_epi8(t0, even, t1));
    _mm512_storeu_si512(dst + 64, _mm512_permutex2var_epi8(t0, odd, t1));
}


#ifndef FT_PREFETCH_BYTES
#define FT_PREFETCH_BYTES 8192
#endif

/* lane j of a chunk's int32 sums covers columns 8j .. 8j + 7: unit j >> 1, 2, 3 for U = 16, 32, 64 */
static inline __m512i unit_lanes(int U) {
    const int shift = U == 16 ? 1 : U == 32 ? 2 : 3;
    return _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), shift);
}

/* per-lane fp32 factors of chunk c from per-unit values v: one value for U = 128, lane-spread ones below */
static inline __m512 chunk_factors(const float *v, int c, int per_chunk, __m512i lanes) {
    return per_chunk == 1 ? _mm512_set1_ps(v[c]) : _mm512_permutexvar_ps(lanes, _mm512_loadu_ps(v + c * per_chunk));
}

/* the lane sums of a, b, c, d: 16 -> 8 lanes by halves, then two horizontal pair-adds, then 4 + 4 */
static inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
#define FT_HALVES(v) _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)))
    const __m256 ab = _mm256_hadd_ps(FT_HALVES(a), FT_HALVES(b)), cd = _mm256_hadd_ps(FT_HALVES(c), FT_HALVES(d));
#undef FT_HALVES
    const __m256 abcd = _mm256_hadd_ps(ab, cd); /* [a b c d] from lanes 0-3 (of each half-sum), then from lanes 4-7 */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* R weight rows against NT activation rows; su[r]: row r's per-unit scales, already times the activation's d when
 * PRE (decode: NT = 1); zs[r]: its per-unit zero offsets s * z, taken off against xza (d * sum a) at the end.
 * W8: a byte per weight (int8), its chunk's two halves loaded as they are */
static inline __attribute__((always_inline)) void q8_tile(const uint8_t *q, int64_t row_bytes, int K, int U,
                                                          const float **su, const float **zs, const int8_t **x,
                                                          const float **xd, const float **xza, float *y, int ldy,
                                                          int ldt, const int R, const int NT, const int PRE,
                                                          const int W8) {
    const __m512i lanes = unit_lanes(U), LO = _mm512_set1_epi8(0x0F);
    const int nu = K / U, per_chunk = 128 / U, pf = W8 ? ft_row_prefetch : 0;
    __m512 tot[4][4];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) tot[r][t] = _mm512_setzero_ps();
    for (int c = 0; c < K / 128; c++) {
        __m512i xe[4], xo[4];
        __m512 dv[4];
        for (int t = 0; t < NT; t++) {
            xe[t] = _mm512_loadu_si512(x[t] + 128 * c);
            xo[t] = _mm512_loadu_si512(x[t] + 128 * c + 64);
            if (!PRE) dv[t] = chunk_factors(xd[t], c, per_chunk, lanes);
        }
        for (int r = 0; r < R; r++) {
            const uint8_t *qr = q + r * row_bytes + (W8 ? 128 : 64) * c;
            if (!W8) _mm_prefetch((const char *)(qr + FT_PREFETCH_BYTES), _MM_HINT_T1);
            else if (pf) { /* int8: one row at a time, as bf16 rows (ft_row_prefetch) */
                _mm_prefetch((const char *)qr + pf, _MM_HINT_T1);
                _mm_prefetch((const char *)qr + pf + 64, _MM_HINT_T1);
            }
            const __m512i src = _mm512_loadu_si512(qr);
            const __m512i lo = W8 ? src : _mm512_and_si512(src, LO);
            const __m512i hi = W8 ? _mm512_loadu_si512(qr + 64) : _mm512_and_si512(_mm512_srli_epi16(src, 4), LO);
            const __m512 sv = chunk_factors(su[r], c, per_chunk, lanes);
            for (int t = 0; t < NT; t++) {
                __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xe[t]);
                acc = _mm512_dpbusd_epi32(acc, hi, xo[t]);
                tot[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), PRE ? sv : _mm512_mul_ps(sv, dv[t]), tot[r][t]);
            }
        }
    }
    for (int u = 0; u < nu; u += 16) {
        const __mmask16 k = nu - u >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nu - u)) - 1);
        for (int t = 0; t < NT; t++) {
            const __m512 za = _mm512_maskz_loadu_ps(k, xza[t] + u);
            for (int r = 0; r < R; r++)
                tot[r][t] = _mm512_fnmadd_ps(_mm512_maskz_loadu_ps(k, zs[r] + u), za, tot[r][t]);
        }
    }
    /* four sums per tree (rows in decode, tokens otherwise): each vector's lanes added in the same order whichever
     * tile it came from, so a token's result does not depend on its batch */
    const __m512 zero = _mm512_setzero_ps();
    float s[4];
    if (R == 4) { /* (NT = 1) */
        _mm_storeu_ps(s, hsum4(tot[0][0], tot[1][0], tot[2][0], tot[3][0]));
        for (int r = 0; r < 4; r++) y[(int64_t)r * ldy] = s[r];
    } else { /* (R = 1) */
        _mm_storeu_ps(s, hsum4(tot[0][0], NT > 1 ? tot[0][1] : zero, NT > 2 ? tot[0][2] : zero,
                               NT > 3 ? tot[0][3] : zero));
        for (int t = 0; t < NT; t++) y[(int64_t)t * ldt] = s[t];
    }
}

/* the driver's (rows_int8_driver.h) per-block loops: zs = sc * z (the compiler's loop: 4% of the layer), and sd =
 * su * the activation's d, a row's units 16 at a time (a scalar loop over nu: 13% of the layer) */
static inline void q_zero_products(const float *sc, const uint8_t *z, float *zs, int64_t cells) {
    int64_t i = 0;
    for (; i + 16 <= cells; i += 16)
        _mm512_storeu_ps(zs + i, _mm512_mul_ps(_mm512_loadu_ps(sc + i), _mm512_cvtepi32_ps(
            _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(z + i))))));
    for (; i < cells; i++) zs[i] = sc[i] * (float)z[i];
}

static inline void q_fold_d(const float *su, const float *xd0, float *sd, int64_t rows, int nu) {
    for (int u = 0; u < nu; u += 16) {
        const __mmask16 k = nu - u >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nu - u)) - 1);
        const __m512 d = _mm512_maskz_loadu_ps(k, xd0 + u);
        for (int64_t j = 0; j < rows; j++)
            _mm512_mask_storeu_ps(sd + j * nu + u, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, su + j * nu + u), d));
    }
}

#include "rows_int8_driver.h"

#elif !(defined(__AVX2__) && defined(__FMA__)) /* neither AVX512-VNNI nor AVX2 (rows_int8_avx2.c) */

int ft_path_q_built(void) { return 0; }
void ft_prepare_q(const ft_matrix *m, const void *x, int32_t x_kind, int64_t x_stride, const int32_t *rows, int n,
                  int first, int count, void *buf, ft_acts *a) {
    (void)m; (void)x; (void)x_kind; (void)x_stride; (void)rows; (void)n; (void)first; (void)count; (void)buf; (void)a;
}
void ft_rows_dot_q(const ft_matrix *m, int e, int r0, int r1, const ft_acts *a, const int32_t *idx, int n,
                   float *y, int ldy, float *scratch) {
    (void)m; (void)e; (void)r0; (void)r1; (void)a; (void)idx; (void)n; (void)y; (void)ldy; (void)scratch;
}
#endif

int64_t ft_rows_scratch_q_floats(const ft_matrix *m) {
    const int64_t nu = m->cols / ft_q_unit_of(m);
    return (int64_t)FT_ROW_BLOCK * (m->scale_cols + 3 * nu) + 128;
}
