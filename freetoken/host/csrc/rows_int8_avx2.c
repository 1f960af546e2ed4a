/* Path Q on CPUs with AVX2 but no AVX512-VNNI (AMD Zen 2 / 3, Intel before Ice Lake): the same int8 activations,
 * layout and rule as rows_int8.c, with the products made by vpmaddubsw (unsigned nibble x signed int8, pairs summed
 * to int16; at most 8 products per int16 lane, 8 x 15 x 127 < 2^15: no saturation) and vpmaddwd against ones (to
 * int32), llama.cpp's AVX2 Q4_0 x Q8_0 dot. Without it int4 rows took path B, a nibble at a time through a lookup
 * table (0.8 GB/s on a Zen 3 core). A 128-column chunk is two 32-byte halves of nibbles: int32 lane j of half h
 * sums columns 64h + 8j .. 64h + 8j + 7, so a unit of U columns is lanes j >> log2(U / 8) of a half (U = 128: both
 * halves).
 * The result equals the dequantized weights times int8_acts_ref up to fp32 summation order, and every activation
 * row gets the same instruction sequence whatever the batch. */
#include <math.h>
#include <string.h>
#include "rows_int8.h"

#if !defined(FT_Q_AVX512) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* int4 rows are prefetched this many bytes ahead into L1: on a Zen 3 core the hardware prefetcher alone left the
 * 8-expert GPTQ layer at 0.62-0.68 ms from DRAM (0.33 from L3); 2-8 KB ahead, 0.46-0.56 */
#define Q_PREFETCH_BYTES 4096

int ft_path_q_built(void) { return 2; } /* (rows_int8.c's AVX512-VNNI build: 1) */

/* one 128-column chunk of bf16 activations -> int8 (even columns, then odd; natural: in column order) with the
 * per-unit d and d * sum(a): rows_int8.c's arithmetic, eight lanes at a time */
static void quantize_chunk(const uint16_t *x, int U, int8_t *dst, float *xd, float *xza, int natural) {
    const __m256 ABS = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i ORDER = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256 v[16];
    __m256i a[16];
    for (int j = 0; j < 16; j++)
        v[j] = ft_bf16x8(x + 8 * j);
    const int regs = U / 8; /* registers per unit */
    for (int u = 0; u < 16 / regs; u++) {
        __m256 m = _mm256_setzero_ps();
        int nan = 0;
        for (int j = u * regs; j < (u + 1) * regs; j++) {
            m = _mm256_max_ps(m, _mm256_and_ps(v[j], ABS));
            nan |= _mm256_movemask_ps(_mm256_cmp_ps(v[j], v[j], _CMP_UNORD_Q));
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        const float amax = _mm_cvtss_f32(h), d = nan ? NAN : amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        __m256i sum = _mm256_setzero_si256();
        for (int j = u * regs; j < (u + 1) * regs; j++) {
            __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], _mm256_set1_ps(id))); /* nearest, ties to even */
            a[j] = q = _mm256_max_epi32(_mm256_min_epi32(q, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
            sum = _mm256_add_epi32(sum, q);
        }
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
        xd[u] = d;
        xza[u] = d * (float)_mm_cvtsi128_si32(s);
    }
    int8_t q[128];
    for (int j = 0; j < 16; j += 4) { /* 32 int32 -> 32 int8 in column order */
        const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(a[j], a[j + 1]),
                                             _mm256_packs_epi32(a[j + 2], a[j + 3]));
        _mm256_storeu_si256((__m256i *)(q + 8 * j), _mm256_permutevar8x32_epi32(b, ORDER));
    }
    if (natural) {
        memcpy(dst, q, 128);
        return;
    }
    for (int k = 0; k < 64; k++) dst[k] = q[2 * k], dst[64 + k] = q[2 * k + 1];
}


/* the int32 sums of one half (32 bytes of nibbles against its 32 even and 32 odd int8 activations) */
static inline __m256i half_dot(__m256i src, __m256i xe, __m256i xo) {
    const __m256i LO = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_and_si256(src, LO), hi = _mm256_and_si256(_mm256_srli_epi16(src, 4), LO);
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo)),
                             _mm256_set1_epi16(1));
}

/* unsigned bytes (int8 weights, 0..255) against signed int8 activations, four products per int32 lane: as two
 * nibble halves, w = lo + 16 hi (vpmaddubsw on whole bytes would saturate its int16 pair sums) */
static inline __m256i byte_dot(__m256i w, __m256i x) {
    const __m256i LO = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_and_si256(w, LO), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), LO);
    return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, x), _mm256_set1_epi16(1)),
                            _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x), _mm256_set1_epi16(16)));
}

/* per-lane factors of half h of chunk c from per-unit values v (U < 128) */
static inline __m256 half_factors(const float *v, int c, int h, int per_chunk, __m256i lanes) {
    return _mm256_permutevar8x32_ps(_mm256_loadu_ps(v + c * per_chunk + h * (per_chunk / 2)), lanes);
}

/* a mask of lanes 0 .. n - 1 (maskload's: the others read as 0) */
static inline __m256i first_lanes(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* the int32 sums of one 128-column chunk of int4 weights as one unit (64 bytes, byte b: columns 2b and 2b + 1 in its
 * low and high nibble) against its int8 activations in quantize_chunk's order (even columns, then odd): the four
 * int16 pair sums added first (at most 4 x 3810) */
static inline __m256i q4_chunk(const uint8_t *qc, const int8_t *xc) {
    const __m256i LO = _mm256_set1_epi8(0x0F);
    const __m256i s0 = _mm256_loadu_si256((const __m256i *)qc), s1 = _mm256_loadu_si256((const __m256i *)(qc + 32));
    const __m256i p0 = _mm256_add_epi16(
        _mm256_maddubs_epi16(_mm256_and_si256(s0, LO), _mm256_loadu_si256((const __m256i *)xc)),
        _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(s0, 4), LO),
                             _mm256_loadu_si256((const __m256i *)(xc + 64))));
    const __m256i p1 = _mm256_add_epi16(
        _mm256_maddubs_epi16(_mm256_and_si256(s1, LO), _mm256_loadu_si256((const __m256i *)(xc + 32))),
        _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(s1, 4), LO),
                             _mm256_loadu_si256((const __m256i *)(xc + 96))));
    return _mm256_madd_epi16(_mm256_add_epi16(p0, p1), _mm256_set1_epi16(1));
}

/* Decode of int4 rows with one unit per 128-column chunk (group 128: the usual GPTQ / AWQ / AutoRound layout), a row
 * at a time: tiles of four rows (or two, 32 rows apart) compute faster from L3 but interleave streams the hardware
 * prefetcher does not follow. q8_tile's operations for one row against one activation row, in the same order and
 * with the same products (the factors s * d and zero products s * z made here per unit, not in passes over the block
 * before it), the unit's branch out of the loop, two chunks a turn. s, z: the row's scales and zeros; d, za: the
 * activation's per-unit d and d * sum(a). The 8-expert GPTQ g128 layer on a Zen 3 core, one thread, from DRAM: four
 * rows a tile 0.45-0.49 ms (0.27-0.28 from L3); a row at a time 0.36-0.37, and 0.32-0.35 without the two passes. */
static inline __m256 q4_row_u128(const uint8_t *q, int K, const float *s, const uint8_t *z, const int8_t *x,
                                 const float *d, const float *za) {
    const int nu = K / 128;
    __m256 tot = _mm256_setzero_ps();
#pragma GCC unroll 2
    for (int c = 0; c < nu; c++) {
        _mm_prefetch((const char *)q + 64 * c + Q_PREFETCH_BYTES, _MM_HINT_T0);
        tot = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_chunk(q + 64 * c, x + 128 * c)), _mm256_set1_ps(s[c] * d[c]), tot);
    }
    for (int u = 0; u < nu; u += 8) { /* the zero points, as q8_tile: lanes past the row's last unit 0 x 0 */
        const int left = nu - u < 8 ? nu - u : 8;
        const __m256i k = first_lanes(left);
        uint64_t zb = 0; /* (8 bytes from z + u only where the row has them: the last row's zeros may end a page) */
        if (left == 8) memcpy(&zb, z + u, 8);
        else for (int i = 0; i < left; i++) zb |= (uint64_t)z[u + i] << (8 * i);
        const __m256 zf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((int64_t)zb)));
        tot = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_maskload_ps(s + u, k), zf), _mm256_maskload_ps(za + u, k), tot);
    }
    return tot;
}

/* the driver's decode of a block of rows in that layout (s, z: the block's scales and zeros, a row's nu apart) */
static inline void q_decode_rows(const uint8_t *q, int64_t row_bytes, int K, int rows, const float *s,
                                 const uint8_t *z, const int8_t *x, const float *d, const float *za, float *y,
                                 int ldy) {
    const int nu = K / 128;
    for (int r = 0; r < rows; r++)
        y[(int64_t)r * ldy] = ft_hsum8(q4_row_u128(q + (int64_t)r * row_bytes, K, s + (int64_t)r * nu,
                                                   z + (int64_t)r * nu, x, d, za));
}
#define Q_DECODE_BLOCK q_decode_rows /* (rows_int8_driver.h) */

/* R weight rows against NT activation rows (rows_int8.c's q8_tile: su, zs, PRE, W8 as there) */
static inline __attribute__((always_inline)) void q8_tile(const uint8_t *q, int64_t row_bytes, int K, int U,
                                                          const float **su, const float **zs, const int8_t **x,
                                                          const float **xd, const float **xza, float *y, int ldy,
                                                          int ldt, const int R, const int NT, const int PRE,
                                                          const int W8) {
    const __m256i lanes = _mm256_srli_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), U == 16 ? 1 : U == 32 ? 2 : 3);
    const int nu = K / U, per_chunk = 128 / U, pf = W8 ? ft_row_prefetch : 0;
    __m256 tot[4][4];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) tot[r][t] = _mm256_setzero_ps();
    for (int c = 0; c < K / 128; c++) {
        for (int r = 0; r < R; r++) {
            const uint8_t *qr = q + r * row_bytes + (W8 ? 128 : 64) * c;
            if (pf) /* int8 rows: one at a time, as bf16 rows (ft_row_prefetch) */
                _mm_prefetch((const char *)qr + pf, _MM_HINT_T1), _mm_prefetch((const char *)qr + pf + 64, _MM_HINT_T1);
            if (!W8) _mm_prefetch((const char *)qr + Q_PREFETCH_BYTES, _MM_HINT_T0);
            const __m256i s0 = _mm256_loadu_si256((const __m256i *)qr);
            const __m256i s1 = _mm256_loadu_si256((const __m256i *)(qr + 32));
            const __m256i s2 = W8 ? _mm256_loadu_si256((const __m256i *)(qr + 64)) : s0;
            const __m256i s3 = W8 ? _mm256_loadu_si256((const __m256i *)(qr + 96)) : s1;
            for (int t = 0; t < NT; t++) {
                const int8_t *xc = x[t] + 128 * c;
                const __m256i x0 = _mm256_loadu_si256((const __m256i *)xc);
                const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xc + 32));
                const __m256i x2 = _mm256_loadu_si256((const __m256i *)(xc + 64));
                const __m256i x3 = _mm256_loadu_si256((const __m256i *)(xc + 96));
                __m256i a0, a1;
                if (W8) { /* a byte per weight, natural order: one unit of 128 columns (group % 128 == 0) */
                    a0 = _mm256_add_epi32(byte_dot(s0, x0), byte_dot(s1, x1));
                    a1 = _mm256_add_epi32(byte_dot(s2, x2), byte_dot(s3, x3));
                } else if (per_chunk == 1) { /* one unit */
                    a0 = q4_chunk(qr, xc);
                    a1 = _mm256_setzero_si256();
                } else {
                    a0 = half_dot(s0, x0, x2); /* columns 0..63: even ones in x0, odd ones in x2 */
                    a1 = half_dot(s1, x1, x3);
                }
                if (per_chunk == 1) {
                    const float f = PRE ? su[r][c] : su[r][c] * xd[t][c];
                    const __m256i acc = W8 ? _mm256_add_epi32(a0, a1) : a0;
                    tot[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(f), tot[r][t]);
                } else {
                    __m256 f0 = half_factors(su[r], c, 0, per_chunk, lanes);
                    __m256 f1 = half_factors(su[r], c, 1, per_chunk, lanes);
                    if (!PRE) {
                        f0 = _mm256_mul_ps(f0, half_factors(xd[t], c, 0, per_chunk, lanes));
                        f1 = _mm256_mul_ps(f1, half_factors(xd[t], c, 1, per_chunk, lanes));
                    }
                    tot[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0), f0, tot[r][t]);
                    tot[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1), f1, tot[r][t]);
                }
            }
        }
    }
    for (int u = 0; u < nu; u += 8) { /* the zero points: s z d sum(a) per unit, eight units at a time */
        const int left = nu - u < 8 ? nu - u : 8;
        const __m256i k = first_lanes(left);
        for (int t = 0; t < NT; t++) {
            const __m256 za = _mm256_maskload_ps(xza[t] + u, k);
            for (int r = 0; r < R; r++)
                tot[r][t] = _mm256_fnmadd_ps(_mm256_maskload_ps(zs[r] + u, k), za, tot[r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) y[(int64_t)r * ldy + (int64_t)t * ldt] = ft_hsum8(tot[r][t]);
}

/* the driver's per-block loops (the compiler vectorises them) */
static inline void q_zero_products(const float *sc, const uint8_t *z, float *zs, int64_t cells) {
    for (int64_t i = 0; i < cells; i++) zs[i] = sc[i] * (float)z[i];
}

static inline void q_fold_d(const float *su, const float *xd0, float *sd, int64_t rows, int nu) {
    for (int64_t j = 0; j < rows; j++)
        for (int u = 0; u < nu; u++) sd[j * nu + u] = su[j * nu + u] * xd0[u];
}

#include "rows_int8_driver.h"
#endif
