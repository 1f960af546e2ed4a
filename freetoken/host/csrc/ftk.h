/* freetoken host kernels: shared types. Mirrored field by field by freetoken/host/native.py (ctypes). */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <math.h>

/* weight formats: one expert matrix W [rows, cols], y = W x */
enum { FT_F32 = 0, FT_BF16 = 1, FT_F16 = 2, FT_INT4 = 3, FT_FP4 = 4, FT_FP8 = 5, FT_INT8 = 6 };
/* scale encodings */
enum { FT_SC_NONE = 0, FT_SC_F32 = 1, FT_SC_BF16 = 2, FT_SC_F16 = 3, FT_SC_E8M0 = 4, FT_SC_E4M3 = 5 };
enum { FT_GLU_SILU = 0, FT_GLU_CLAMPED = 1, FT_GLU_SILU_LIMIT = 2 };
enum { FT_GLOBAL_NONE = 0, FT_GLOBAL_DIVIDE = 1, FT_GLOBAL_MULTIPLY = 2 };
/* errors */
enum { FT_OK = 0, FT_EFORMAT = -1, FT_ESHAPE = -2, FT_ENOMEM = -3 };

/* One matrix per expert, experts `*_stride` bytes apart (freetoken/quant/packed.py's layouts):
 * dense: data [rows, cols] of kind F32/BF16/F16;
 * int4:  data [rows, cols/2] (low nibble = even col), scales [rows, cols/group], zeros uint8 [rows, cols/group],
 *        optional g_idx int32 [cols] (group of each col): w = (q - zero) * scale;
 * int8:  data uint8 [rows, cols], scales and zeros as int4's (no g_idx): w = (q - zero) * scale;
 * fp4:   data [rows, cols/2] e2m1 codes, scales uint8 [rows, cols/group] (e8m0 or e4m3), optional global scale;
 * fp8:   data [rows, cols] e4m3, scales fp32 [ceil(rows/block_rows), ceil(cols/group)]. */
typedef struct {
    int32_t kind, rows, cols;
    int32_t group;       /* int4 / fp4: cols per scale; fp8: cols per scale block */
    int32_t block_rows;  /* fp8: rows per scale block */
    int32_t scale_kind;
    int32_t scale_cols;  /* scales per scale row */
    int32_t global_op;
    const uint8_t *data, *scales, *zeros;
    const int32_t *g_idx;
    const float *global_scale; /* [experts] */
    int64_t data_stride, scales_stride, zeros_stride, g_idx_stride; /* bytes between experts (g_idx: elements) */
    int64_t row_bytes;   /* data bytes per row */
} ft_matrix;

/* Activations prepared once per call for the matrices that read them:
 * path A (AVX512-BF16): xb [n, kpad] bf16, natural order (dense / fp8) or permuted per 128-col chunk (int4 / fp4),
 *                       xsum [n, ngroups] (int4: sum of x over each group, for the zero point);
 * path B (portable):    xf [n, cols] fp32;
 * path Q (int4 x int8): xb holds int8 [n, cols] (even columns, then odd, per 128-col chunk), xd [n, ngroups] the
 *                       scale d of each unit, xsum [n, ngroups] d * sum of the unit's int8 values. */
typedef struct {
    int32_t path, kpad, ngroups, cols;
    const uint16_t *xb;
    const float *xsum, *xf, *xd;
} ft_acts;

enum { FT_PATH_A_NATURAL = 0, FT_PATH_A_PERMUTED = 1, FT_PATH_B = 2, FT_PATH_Q8 = 3 };

typedef struct {
    const ft_matrix *gate, *up, *down;
    const float *b_gate_up; /* [E, 2I] fp32 or NULL */
    const float *b_down;    /* [E, D] fp32 or NULL */
    int32_t glu; float alpha, limit;
    const void *x; int32_t x_kind, T;        /* [T, D_in] activations (F32 / BF16 / F16) */
    const int32_t *ids; const float *weights; int32_t K; /* [T, K] routing */
    const uint8_t *take; int32_t E;          /* [E]: 1 = this call computes the expert; NULL: every expert */
    float *out;                              /* [T, D] fp32, overwritten (NULL: out_cast only) */
    void *out_cast; int32_t out_kind;        /* optional: out rounded to the activation dtype, [T, D] */
    int32_t threads, generic;                /* generic: 1 path B only, 2 this build's own paths */
} ft_moe_args;
int ft_moe(const ft_moe_args *a);

typedef struct {
    const ft_matrix *w;                      /* expert 0 of it: [N, K] */
    const float *bias;                       /* [N] fp32 or NULL */
    const void *x; int32_t x_kind, T;        /* [T, K] */
    int64_t x_stride;                        /* elements between rows of x */
    void *out; int32_t out_kind;             /* [T, N] F32 / BF16 / F16 */
    int64_t out_stride;
    int32_t threads, generic;
} ft_linear_args;
int ft_linear(const ft_linear_args *a);

/* rows.c: path selection and one row of W against n prepared activation rows */
int ft_path_a_built(void);
int ft_path_for(const ft_matrix *m, int32_t x_kind, int32_t generic);
int64_t ft_acts_bytes(const ft_matrix *m, int path, int n);
/* prepare rows [first, first + count) of n activation rows (x row rows[i], or i) into buf, laid out for all n */
void ft_prepare(const ft_matrix *m, int path, const void *x, int32_t x_kind, int64_t x_stride, const int32_t *rows,
                int n, int first, int count, void *buf, ft_acts *acts);
/* y[(r - r0) * ldy + i] = row r of expert e . activation row idx[i] (or i), for r in [r0, r1), i < n */
void ft_rows_dot(const ft_matrix *m, int e, int r0, int r1, const ft_acts *a, const int32_t *idx, int n, float *y,
                 int ldy, float *scratch);
int64_t ft_rows_scratch_floats(const ft_matrix *m);
/* scales of rows [r0, r1) of expert e as fp32 [r1 - r0, scale_cols] (fp4: the global scale applied) */
void ft_scales_block(const ft_matrix *m, int e, int r0, int r1, float *sc);
/* the scales and zero points of rows [b0, b1) of expert e (clamped to its rows) on their way while a block before
 * them computes (separate arrays: each block start would otherwise wait on their first misses) */
void ft_prefetch_scales(const ft_matrix *m, int e, int b0, int b1);
#define FT_ROW_BLOCK 64
/* Activation rows a block of weight rows meets per pass in a prefill: as many as share 24 KB (of a 32-48 KB L1 data
 * cache) with the weight row, in multiples of the row kernel's tokens per call, so its dots read activations from L1
 * rather than every token's from L2 for each row. Results do not change: each activation row's sums stay its own. */
static inline int ft_tokens_per_pass(int64_t bytes_per_token, int multiple) {
    const int64_t fit = (24 << 10) / (bytes_per_token > 0 ? bytes_per_token : 1) / multiple * multiple;
    return fit > multiple ? (int)fit : multiple;
}
/* bytes ahead that the bf16 and int8 row kernels prefetch in software while they stream one row at a time (0: none,
 * the hardware prefetcher alone); ft_set_row_prefetch, chosen per CPU by freetoken.host.kernels */
extern int32_t ft_row_prefetch;
void ft_set_row_prefetch(int32_t bytes);

/* number conversions */
static inline float ft_bf16_to_f32(uint16_t b) { union { uint32_t u; float f; } v = {(uint32_t)b << 16}; return v.f; }
static inline uint16_t ft_f32_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
    union { float f; uint32_t u; } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
float ft_scale(const ft_matrix *m, const uint8_t *s, int64_t i);
static inline float ft_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0x1f) v.u = sign | 0x7f800000u | (man << 13);
    else if (exp) v.u = sign | ((exp + 112) << 23) | (man << 13);
    else { v.f = ldexpf((float)man, -24); v.u |= sign; }
    return v.f;
}

static inline uint16_t ft_f32_to_f16(float f) {
    union { float f; uint32_t u; } v = {f};
    uint32_t sign = (v.u >> 16) & 0x8000, a = v.u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to inf */
    if (a < 0x38800000u) { /* subnormal half: round to nearest even at 2^-24 */
        float m = fabsf(f) * 16777216.0f;
        return (uint16_t)(sign | (uint32_t)nearbyintf(m));
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u;
    return (uint16_t)(sign | (r >> 13));
}

static inline float ft_load_act(const void *x, int32_t kind, int64_t i) {
    if (kind == FT_BF16) return ft_bf16_to_f32(((const uint16_t *)x)[i]);
    if (kind == FT_F16) return ft_f16_to_f32(((const uint16_t *)x)[i]);
    return ((const float *)x)[i];
}

/* v stored at out[i] in the activation dtype (rounded to nearest even) */
static inline void ft_store_act(void *out, int32_t kind, int64_t i, float v) {
    if (kind == FT_BF16) ((uint16_t *)out)[i] = ft_f32_to_bf16(v);
    else if (kind == FT_F16) ((uint16_t *)out)[i] = ft_f32_to_f16(v);
    else ((float *)out)[i] = v;
}

static inline float ft_round_act(float v, int32_t kind) {
    if (kind == FT_BF16) return ft_bf16_to_f32(ft_f32_to_bf16(v));
    if (kind == FT_F16) return ft_f16_to_f32(ft_f32_to_f16(v));
    return v;
}


/* attention.c: one query per sequence (decode) against each sequence's own KV cache, all sequences in one call */
typedef struct {
    int32_t B, H, Hkv, Dh;
    const void *q; int32_t q_kind;                 /* [B, H, Dh] */
    const void *const *k; const void *const *v;    /* per sequence [>= len, Hkv, Dh] */
    const float *const *k_scale; const float *const *v_scale; /* per sequence [>= len, Hkv] (fp8 cache) or NULL */
    int32_t kv_kind;                               /* F32 / BF16 / F16 / FP8 */
    const int32_t *len;                            /* [B] positions visible to the query (itself included) */
    float sm_scale;
    const float *sinks;                            /* [H] or NULL */
    int32_t window;                                /* the last `window` positions only; 0: all */
    void *out; int32_t out_kind;                   /* [B, H, Dh] */
    int32_t threads;
} ft_attn_args;

/* step.c: a decode token's attention after its qkv projection, one call: per-head (or whole-projection) RMSNorm of
 * q and k, rotary embedding, k and v written into each sequence's cache at its position, attention */
typedef struct {
    int32_t B, H, Hkv, Dh;
    const void *qkv; int32_t kind; int64_t qkv_stride;     /* [B, (H + 2 Hkv) Dh] rows, activation dtype */
    const void *q_norm; const void *k_norm; int32_t norm_kind; /* RMSNorm weights or NULL */
    int32_t norm_full;                                       /* 0: per head [Dh]; 1: over the projection */
    float eps; int32_t round_normed;
    const int64_t *positions;                                /* [B] */
    const float *inv_freq; int32_t rotary; float rope_scale; /* rotary <= 0: no rotary embedding */
    void *const *k_cache; void *const *v_cache; int32_t kv_kind; /* per sequence [>= pos + 1, Hkv, Dh] */
    float sm_scale; const float *sinks; int32_t window;
    void *q_buf;                                             /* [B, H, Dh] scratch in the activation dtype */
    void *out;                                               /* [B, H, Dh] activation dtype */
    int32_t threads;
} ft_step_args;
int ft_attention_decode(const ft_attn_args *a);
int ft_attention_step(const ft_step_args *a);

/* small.c: a decode step's small ops */
int ft_rms_norm(const void *x, int32_t kind, int64_t x_stride, int32_t T, int32_t D, const void *w, int32_t w_kind,
                float eps, int32_t round_normed, void *out, int64_t out_stride, int32_t threads);
int ft_softmax_topk(const void *logits, int32_t kind, int32_t T, int32_t E, int32_t K, int32_t renormalize,
                    float scale, float *weights, int32_t *ids, int32_t threads);

#if defined(__AVX2__)
#include <immintrin.h>
/* 8 bf16 values -> fp32 (a bf16 is the top half of its fp32) */
static inline __m256 ft_bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
#if defined(__AVX512F__)
static inline __m512 ft_bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
#endif

/* the 8 lanes' sum, in one fixed order (the AVX2 row kernels' last step: a token's result keeps its batch-free
 * arithmetic) */
static inline float ft_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif
