/* One row of an expert matrix against n prepared activation rows, in the matrix's stored format.
 * Path B (here): the row is decoded to fp32 exactly as freetoken.quant.packed.dequantize_packed does, then one fp32
 * dot per activation row (bf16 rows on AVX2: widened in registers, no fp32 copy). Path A (rows_avx512.c): bf16
 * dot products on the packed bits, where the CPU has them.
 * The choice is per matrix (ft_path_for); both give each activation row the same arithmetic whatever n is, so a
 * token's result does not depend on the batch it came in. */
#include <math.h>
#include <string.h>
#include "ftk.h"
#include "rows_avx512.h"
#include "rows_int8.h"
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

static float e4m3_value(uint8_t b) {
    int e = (b >> 3) & 0xf, m = b & 7;
    float v;
    if ((b & 0x7f) == 0x7f) return NAN;
    v = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf(m / 8.0f, -6);
    return (b & 0x80) ? -v : v;
}

/* every byte's value as an fp8 e4m3 weight or scale, and as an e8m0 scale (2^(b - 127), 0xff NaN), filled on the
 * library's load: one load per scale instead of an ldexpf (the scales of an MXFP4 / NVFP4 row were most of its time) */
static float E4M3[256], E8M0[256];
__attribute__((constructor)) static void fill_tables(void) {
    for (int b = 0; b < 256; b++) {
        E4M3[b] = e4m3_value((uint8_t)b);
        E8M0[b] = b == 0xff ? NAN : ldexpf(1.0f, b - 127);
    }
}

static const float NIBBLE[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}; /* an int4's value */
static const float E2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* scale i of a row's scales as fp32 */
float ft_scale(const ft_matrix *m, const uint8_t *s, int64_t i) {
    switch (m->scale_kind) {
    case FT_SC_F32: return ((const float *)s)[i];
    case FT_SC_BF16: return ft_bf16_to_f32(((const uint16_t *)s)[i]);
    case FT_SC_F16: return ft_f16_to_f32(((const uint16_t *)s)[i]);
    case FT_SC_E8M0: return E8M0[s[i]];
    case FT_SC_E4M3: return E4M3[s[i]];
    default: return 1.0f;
    }
}

int32_t ft_row_prefetch = 0;

void ft_set_row_prefetch(int32_t bytes) { ft_row_prefetch = bytes > 0 ? bytes : 0; }

int ft_path_for(const ft_matrix *m, int32_t x_kind, int32_t generic) {
    if (generic == 1 || x_kind != FT_BF16) return FT_PATH_B; /* (2: this build's own paths, as 0) */
    if (ft_path_q_unit(m)) return FT_PATH_Q8;
    if (!ft_path_a_built()) return FT_PATH_B;
    return ft_path_a_supports(m);
}

static int64_t kpad_of(const ft_matrix *m) { return ((int64_t)m->cols + 127) / 128 * 128; }

int64_t ft_acts_bytes(const ft_matrix *m, int path, int n) {
    if (path == FT_PATH_B) return (int64_t)n * m->cols * 4;
    if (path == FT_PATH_Q8) return ft_acts_q_bytes(m, n);
    int64_t groups = m->group > 0 ? m->cols / m->group : 1;
    return (int64_t)n * kpad_of(m) * 2 + (int64_t)n * (groups + 16) * 4;
}

void ft_prepare(const ft_matrix *m, int path, const void *x, int32_t x_kind, int64_t x_stride, const int32_t *rows,
                int n, int first, int count, void *buf, ft_acts *a) {
    memset(a, 0, sizeof *a);
    a->path = path;
    a->cols = m->cols;
    if (path == FT_PATH_B) {
        float *xf = (float *)buf;
        for (int i = first; i < first + count; i++) {
            int64_t r = rows ? rows[i] : i;
            for (int k = 0; k < m->cols; k++) xf[(int64_t)i * m->cols + k] = ft_load_act(x, x_kind, r * x_stride + k);
        }
        a->xf = xf;
        return;
    }
    if (path == FT_PATH_Q8) {
        ft_prepare_q(m, x, x_kind, x_stride, rows, n, first, count, buf, a);
        return;
    }
    ft_prepare_a(m, path, x, x_stride, rows, n, first, count, buf, a);
}

int64_t ft_rows_scratch_floats(const ft_matrix *m) {
    const int64_t a = (int64_t)m->cols + 64 + (int64_t)FT_ROW_BLOCK * (2 * (int64_t)m->scale_cols + 32);
    const int64_t q = m->kind == FT_INT4 || m->kind == FT_INT8 ? ft_rows_scratch_q_floats(m) : 0;
    return a > q ? a : q;
}

void ft_scales_block(const ft_matrix *m, int e, int r0, int r1, float *sc) {
    const uint8_t *s = m->scales + (int64_t)e * m->scales_stride + (int64_t)r0 * m->scale_cols * (
        m->scale_kind == FT_SC_F32 ? 4 : m->scale_kind == FT_SC_BF16 || m->scale_kind == FT_SC_F16 ? 2 : 1);
    const int64_t n = (int64_t)(r1 - r0) * m->scale_cols;
    switch (m->scale_kind) {
    case FT_SC_F32: memcpy(sc, s, (size_t)n * 4); break;
    case FT_SC_BF16: for (int64_t i = 0; i < n; i++) sc[i] = ft_bf16_to_f32(((const uint16_t *)s)[i]); break;
    case FT_SC_F16: {
        int64_t i = 0;
#ifdef __F16C__
        for (; i + 8 <= n; i += 8) /* eight at a time (the scalar loop was a fifth of an int4 decode layer) */
            _mm256_storeu_ps(sc + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)s + i))));
#endif
        for (; i < n; i++) sc[i] = ft_f16_to_f32(((const uint16_t *)s)[i]);
        break;
    }
    case FT_SC_E8M0: for (int64_t i = 0; i < n; i++) sc[i] = E8M0[s[i]]; break;
    case FT_SC_E4M3: for (int64_t i = 0; i < n; i++) sc[i] = E4M3[s[i]]; break;
    default: for (int64_t i = 0; i < n; i++) sc[i] = ft_scale(m, s, i);
    }
    if (m->kind == FT_FP4 && m->global_op != FT_GLOBAL_NONE) {
        const float g = m->global_scale[e];
        if (m->global_op == FT_GLOBAL_DIVIDE) for (int64_t i = 0; i < n; i++) sc[i] = sc[i] / g;
        else for (int64_t i = 0; i < n; i++) sc[i] = sc[i] * g;
    }
}

void ft_prefetch_scales(const ft_matrix *m, int e, int b0, int b1) {
    if (b1 > m->rows) b1 = m->rows;
    if (b0 >= b1 || !m->scales) return;
    if (m->kind == FT_FP8) /* one scale row per block of rows */
        b0 /= m->block_rows, b1 = (b1 + m->block_rows - 1) / m->block_rows;
    const int es = m->scale_kind == FT_SC_F32 ? 4 : m->scale_kind == FT_SC_BF16 || m->scale_kind == FT_SC_F16 ? 2 : 1;
    const uint8_t *s = m->scales + (int64_t)e * m->scales_stride + (int64_t)b0 * m->scale_cols * es;
    for (int64_t o = 0; o < (int64_t)(b1 - b0) * m->scale_cols * es; o += 64) __builtin_prefetch(s + o, 0, 3);
    if (m->zeros) {
        const uint8_t *z = m->zeros + (int64_t)e * m->zeros_stride + (int64_t)b0 * m->scale_cols;
        for (int64_t o = 0; o < (int64_t)(b1 - b0) * m->scale_cols; o += 64) __builtin_prefetch(z + o, 0, 3);
    }
}

/* w[k] = lut[nibble k of d] for k in [0, K) (nibble k: byte k / 2, low half first), a byte at a time */
static inline void nibbles(const uint8_t *d, int K, const float *lut, float *w) {
    int k = 0;
    for (; k + 1 < K; k += 2) {
        const uint8_t b = d[k >> 1];
        w[k] = lut[b & 0xf];
        w[k + 1] = lut[b >> 4];
    }
    if (k < K) w[k] = lut[d[k >> 1] & 0xf];
}

/* Path B: row `row` of expert e decoded to fp32 [cols]; sc: room for the row's scales [scale_cols] */
static void decode_row(const ft_matrix *m, int e, int row, float *w, float *sc) {
    const uint8_t *d = m->data + (int64_t)e * m->data_stride + (int64_t)row * m->row_bytes;
    const int K = m->cols;
    switch (m->kind) {
    case FT_F32: memcpy(w, d, (size_t)K * 4); return;
    case FT_BF16: for (int k = 0; k < K; k++) w[k] = ft_bf16_to_f32(((const uint16_t *)d)[k]); return;
    case FT_F16: {
        int k = 0;
#ifdef __F16C__
        for (; k + 8 <= K; k += 8) /* eight at a time: the scalar conversion made an fp16 row 14x slower than bf16 */
            _mm256_storeu_ps(w + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)d + k))));
#endif
        for (; k < K; k++) w[k] = ft_f16_to_f32(((const uint16_t *)d)[k]);
        return;
    }
    default: break;
    }
    /* the row's scales decoded once (ft_scales_block: the global FP4 scale folded in), not one ft_scale call per
     * weight: that call made path B's quantized rows 5-170x slower than the same rows on path A */
    const int G = m->group;
    if (m->kind == FT_FP8) {
        const int r = row / m->block_rows;
        ft_scales_block(m, e, r, r + 1, sc);
        for (int k0 = 0; k0 < K; k0 += G) { /* by group: no division per weight */
            const float c = sc[k0 / G];
            const int k1 = k0 + G < K ? k0 + G : K;
            for (int k = k0; k < k1; k++) w[k] = E4M3[d[k]] * c;
        }
        return;
    }
    ft_scales_block(m, e, row, row + 1, sc);
    const uint8_t *z = m->zeros ? m->zeros + (int64_t)e * m->zeros_stride + (int64_t)row * m->scale_cols : NULL;
    if (m->kind == FT_INT8) { /* (q - zero) * scale, group k / group */
        for (int k0 = 0; k0 < K; k0 += G) {
            const float c = sc[k0 / G], zz = (float)z[k0 / G];
            const int k1 = k0 + G < K ? k0 + G : K;
            for (int k = k0; k < k1; k++) w[k] = ((float)d[k] - zz) * c;
        }
        return;
    }
    /* FP4 (E2M1 x scale) and int4 ((q - zero) x scale): the nibbles' values, then each group's scale (and zero) */
    nibbles(d, K, m->kind == FT_FP4 ? E2M1 : NIBBLE, w);
    if (m->g_idx) { /* int4, act order: the group of weight k is g_idx[k] */
        const int32_t *gi = m->g_idx + (int64_t)e * m->g_idx_stride;
        for (int k = 0; k < K; k++) w[k] = (w[k] - (float)z[gi[k]]) * sc[gi[k]];
        return;
    }
    /* group k / group, in a pass the compiler vectorises */
    for (int k0 = 0; k0 < K; k0 += G) {
        const float c = sc[k0 / G], zz = z ? (float)z[k0 / G] : 0.0f;
        const int k1 = k0 + G < K ? k0 + G : K;
        if (m->kind == FT_FP4)
            for (int k = k0; k < k1; k++) w[k] *= c;
        else
            for (int k = k0; k < k1; k++) w[k] = (w[k] - zz) * c;
    }
}

/* fp32 rows (path B): `omp simd reduction` compiled to a scalar loop here, one FMA's latency per product (8-37x
 * slower than torch's fp32 GEMV). Four 16-float FMA chains instead: AVX-512 (the tail masked, one horizontal sum);
 * AVX2 takes row_dot below; elsewhere 64 partial sums in lanes the compiler may map to vector registers. */
#if defined(__AVX512F__) && !defined(FT_NO_AVX512)
#define FT_DOT_F32 1
static float dot_f32(const float *w, const float *x, int K) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int k = 0;
    for (; k + 64 <= K; k += 64) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 16), _mm512_loadu_ps(x + k + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 32), _mm512_loadu_ps(x + k + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 48), _mm512_loadu_ps(x + k + 48), a3);
    }
    for (; k + 16 <= K; k += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a0);
    if (k < K) {
        const __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + k), _mm512_maskz_loadu_ps(m, x + k), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}
#elif !(defined(__AVX2__) && defined(__FMA__))
#define FT_DOT_F32 1
static float dot_f32(const float *w, const float *x, int K) {
    float acc[64] = {0.0f};
    int k = 0;
    for (; k + 64 <= K; k += 64)
        for (int j = 0; j < 64; j++) acc[j] += w[k + j] * x[k + j];
    for (; k + 16 <= K; k += 16)
        for (int j = 0; j < 16; j++) acc[j] += w[k + j] * x[k + j];
    for (int j = 0; j < 16; j++) acc[j] += acc[j + 16] + acc[j + 32] + acc[j + 48];
    for (int half = 8; half > 0; half /= 2)  /* a tree, not a chain of 16 dependent adds */
        for (int j = 0; j < half; j++) acc[j] += acc[j + half];
    float sum = acc[0];
    for (; k < K; k++) sum += w[k] * x[k];
    return sum;
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* bf16 and fp32 rows on path B (CPUs without AVX512-BF16): a bf16 row widened to fp32 in registers (a bf16 is the
 * top half of its fp32) against up to three activation rows, instead of decode_row's fp32 copy and a second pass
 * over it: on a Zen 3 core the 8-expert bf16 layer went from 1.63-1.79 to 1.21-1.23 ms (48-53% -> 66-72% of the read
 * bandwidth, benchmarks/host_hugepages.py). fp32 rows (as stored, or as decode_row made them) take the same loop:
 * dot_f32's 64 partial sums lived on the stack there, each add waiting on the store before it. Four 8-lane sums per
 * activation row, added in one order whatever NT is (a token's result does not depend on its batch). */
static inline __attribute__((always_inline)) void row_dot(const void *wv, const float *const x[3], int K, const int NT,
                                                          const int W32, float *y[3]) {
    const uint16_t *w = (const uint16_t *)wv;
    const float *wf = (const float *)wv;
    const int pf = W32 ? 0 : ft_row_prefetch;  /* (fp32 rows: no gain measured from 1 KB ahead on Zen 3) */
    __m256 acc[3][4]; /* (12 of the 16 registers: three rows at most) */
    for (int t = 0; t < NT; t++)
        for (int j = 0; j < 4; j++) acc[t][j] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 32 <= K; k += 32) {
        if (pf) _mm_prefetch((const char *)(w + k) + pf, _MM_HINT_T0);
        for (int j = 0; j < 4; j++) {
            const __m256 wj = W32 ? _mm256_loadu_ps(wf + k + 8 * j) : ft_bf16x8(w + k + 8 * j);
            for (int t = 0; t < NT; t++) acc[t][j] = _mm256_fmadd_ps(wj, _mm256_loadu_ps(x[t] + k + 8 * j), acc[t][j]);
        }
    }
    for (; k + 8 <= K; k += 8) {
        const __m256 wk = W32 ? _mm256_loadu_ps(wf + k) : ft_bf16x8(w + k);
        for (int t = 0; t < NT; t++) acc[t][0] = _mm256_fmadd_ps(wk, _mm256_loadu_ps(x[t] + k), acc[t][0]);
    }
    for (int t = 0; t < NT; t++) {
        float sum = ft_hsum8(_mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][1]), _mm256_add_ps(acc[t][2], acc[t][3])));
        for (int kk = k; kk < K; kk++) sum += (W32 ? wf[kk] : ft_bf16_to_f32(w[kk])) * x[t][kk];
        *y[t] = sum;
    }
}

#ifdef FT_DOT_F32
#define F32_DOT 1 /* fp32 rows take dot_f32 */
#else
#define F32_DOT 0
#endif

/* one weight row (bf16, or fp32: W32, a constant at each call site) against activation rows i0 .. i1 - 1, three at a
 * time */
static inline __attribute__((always_inline)) void row_against(const void *w, const ft_acts *a, const int32_t *idx,
                                                              int i0, int i1, int K, const int W32, float *yr) {
    for (int i = i0; i < i1; i += 3) {
        const float *x[3] = {NULL, NULL, NULL};
        float *out[3] = {NULL, NULL, NULL};
        const int nt = i1 - i < 3 ? i1 - i : 3;
        for (int t = 0; t < nt; t++)
            x[t] = a->xf + (int64_t)(idx ? idx[i + t] : i + t) * a->cols, out[t] = yr + i + t;
        if (nt == 3) row_dot(w, x, K, 3, W32, out);
        else if (nt == 2) row_dot(w, x, K, 2, W32, out);
        else row_dot(w, x, K, 1, W32, out);
    }
}
#endif

void ft_rows_dot(const ft_matrix *m, int e, int r0, int r1, const ft_acts *a, const int32_t *idx, int n, float *y,
                 int ldy, float *scratch) {
    if (a->path == FT_PATH_Q8) {
        ft_rows_dot_q(m, e, r0, r1, a, idx, n, y, ldy, scratch);
        return;
    }
    if (a->path != FT_PATH_B) {
        ft_rows_dot_a(m, e, r0, r1, a, idx, n, y, ldy, scratch);
        return;
    }
#if defined(__AVX2__) && defined(__FMA__)
    if (m->kind == FT_BF16 || (m->kind == FT_F32 && !F32_DOT)) { /* rows as stored: tokens a chunk at a time */
        const int chunk = ft_tokens_per_pass((int64_t)a->cols * 4, 3); /* fp32 activations, three per row_dot */
        for (int i0 = 0; i0 < n; i0 += chunk) {
            const int i1 = i0 + chunk < n ? i0 + chunk : n;
            for (int r = r0; r < r1; r++) {
                const uint8_t *w = m->data + (int64_t)e * m->data_stride + (int64_t)r * m->row_bytes;
                if (m->kind == FT_BF16) row_against(w, a, idx, i0, i1, m->cols, 0, y + (int64_t)(r - r0) * ldy);
                else row_against(w, a, idx, i0, i1, m->cols, 1, y + (int64_t)(r - r0) * ldy);
            }
        }
        return;
    }
#endif
    for (int r = r0; r < r1; r++) {
        float *yr = y + (int64_t)(r - r0) * ldy;
        const float *w = scratch;
        if (m->kind == FT_F32) w = (const float *)(m->data + (int64_t)e * m->data_stride + (int64_t)r * m->row_bytes);
        else decode_row(m, e, r, scratch, scratch + m->cols + 64);  /* (ft_rows_scratch_floats: room after cols) */
#ifdef FT_DOT_F32
        for (int i = 0; i < n; i++) yr[i] = dot_f32(w, a->xf + (int64_t)(idx ? idx[i] : i) * a->cols, a->cols);
#else
        row_against(w, a, idx, 0, n, m->cols, 1, yr);
#endif
    }
}
