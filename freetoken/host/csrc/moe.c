/* One MoE layer's experts on the host, for all tokens of the call, in one call: the CPU lane of the hybrid split, the
 * cpu split, and the CPU-only engine.
 *
 *   out[t] = sum over picks k of t whose expert is taken: w[t, k] * down_e(glu(gate_e x_t, up_e x_t))
 *
 * Pairs (t, k) are grouped by expert; each thread owns a slice of rows of every matrix, so each weight row is read
 * once per call however many tokens picked its expert, threads never write the same element, and a token's sum runs
 * over its experts in id order whatever the thread count (results do not depend on threads or batch).
 * The gated activation is rounded to the activation dtype before the down projection (as the GPU kernel's h buffer).
 */
#include <math.h>
#include <omp.h>
#include <string.h>
#include "arena.h"
#include "fastmath.h"
#include "ftk.h"

static inline float glu(float g, float u, int kind, float alpha, float limit) {
    if (kind != FT_GLU_SILU) { /* plain compares (fminf / fmaxf are libm calls the loop would not vectorise past),
                                * with fminf's answer for a NaN: the limit */
        g = g < limit ? g : limit;
        u = u > -limit ? u : -limit;
        u = u < limit ? u : limit;
    }
    if (kind == FT_GLU_CLAMPED) return g / (1.0f + ft_expf(-g * alpha)) * (u + 1.0f);
    return g / (1.0f + ft_expf(-g)) * u;
}

/* the first rows [lo, lo + 8 KB) of expert e's matrix and their first block's scales on their way to L2 while the
 * expert before it computes: each matrix's first lines would otherwise wait for the hardware prefetcher to find the
 * new stream */
static void prefetch_rows(const ft_matrix *m, int e, int64_t lo) {
    if (e < 0) return;
    const uint8_t *p = m->data + (int64_t)e * m->data_stride + lo * m->row_bytes;
    for (int64_t o = 0; o < 8192; o += 64) __builtin_prefetch(p + o, 0, 2);
    ft_prefetch_scales(m, e, (int)lo, (int)lo + FT_ROW_BLOCK);
}

#define DECODE_TOKENS 4 /* calls of up to this many tokens step through whole matrices (see step in ft_moe) */

static int same_layout(const ft_matrix *a, const ft_matrix *b) {
    return a->kind == b->kind && a->cols == b->cols && a->group == b->group;
}

static inline void slice(int64_t n, int tid, int nt, int64_t *lo, int64_t *hi) {
    *lo = n * tid / nt;
    *hi = n * (tid + 1) / nt;
}

int ft_moe(const ft_moe_args *a) {
    const ft_matrix *G = a->gate, *U = a->up, *W2 = a->down;
    const int T = a->T, K = a->K, E = a->E, D = W2->rows, I = G->rows, Din = G->cols;
    if (U->rows != I || W2->cols != I || U->cols != Din) return FT_ESHAPE;
    const int nt = a->threads > 0 ? a->threads : 1;
    const int pg = ft_path_for(G, a->x_kind, a->generic), pu = ft_path_for(U, a->x_kind, a->generic);
    const int pd = ft_path_for(W2, a->x_kind, a->generic);
    const int share = pg == pu && same_layout(G, U);

    /* pairs grouped by expert, token order inside */
    int64_t P = 0;
    size_t need = (size_t)(E + 1) * 8 + (size_t)T * K * 8;
    ft_arena *ar = ft_arena_reset(need);
    if (!ar) return FT_ENOMEM;
    int32_t *start = ft_arena_take(ar, (size_t)(E + 1) * 4), *count = ft_arena_take(ar, (size_t)E * 4);
    memset(count, 0, (size_t)E * 4);
    for (int64_t i = 0; i < (int64_t)T * K; i++) {
        int e = a->ids[i];
        if (e >= 0 && e < E && (!a->take || a->take[e])) count[e]++, P++;
    }
    int64_t acts_g = ft_acts_bytes(G, pg, T), acts_u = share ? 0 : ft_acts_bytes(U, pu, T);
    int64_t acts_d = ft_acts_bytes(W2, pd, (int)P);
    int64_t rs = ft_rows_scratch_floats(G);
    if (ft_rows_scratch_floats(U) > rs) rs = ft_rows_scratch_floats(U);
    if (ft_rows_scratch_floats(W2) > rs) rs = ft_rows_scratch_floats(W2);
    /* rows per step of the gate / up and down loops: a decode's few tokens take a thread's whole share of a matrix at
     * once (gate rows, then up rows: one stream at a time, and the glue per expert, not per block of 64 rows); a
     * prefill's many tokens FT_ROW_BLOCK rows at a time, so that their partial results stay in cache */
    const int64_t step = T <= DECODE_TOKENS ? (I > D ? I : D) : FT_ROW_BLOCK;
    const size_t per_thread = (size_t)(rs + 3 * (size_t)step * T + (size_t)T + 64) * 4;
    need += (size_t)P * 8 + acts_g + acts_u + acts_d + (size_t)P * I * 4 + (size_t)P * I * 2 + (size_t)nt * per_thread +
            (a->out ? 0 : (size_t)T * D * 4);
    ar = ft_arena_reset(need);
    if (!ar) return FT_ENOMEM;
    start = ft_arena_take(ar, (size_t)(E + 1) * 4);
    count = ft_arena_take(ar, (size_t)E * 4);
    int32_t *pair_tok = ft_arena_take(ar, (size_t)P * 4), *pair_k = ft_arena_take(ar, (size_t)P * 4);
    memset(count, 0, (size_t)E * 4);
    for (int64_t i = 0; i < (int64_t)T * K; i++) {
        int e = a->ids[i];
        if (e >= 0 && e < E && (!a->take || a->take[e])) count[e]++;
    }
    start[0] = 0;
    for (int e = 0; e < E; e++) start[e + 1] = start[e] + count[e];
    memset(count, 0, (size_t)E * 4);
    for (int64_t i = 0; i < (int64_t)T * K; i++) {
        int e = a->ids[i];
        if (e >= 0 && e < E && (!a->take || a->take[e])) {
            int32_t p = start[e] + count[e]++;
            pair_tok[p] = (int32_t)(i / K);
            pair_k[p] = (int32_t)(i % K);
        }
    }
    void *buf_g = ft_arena_take(ar, (size_t)acts_g), *buf_u = share ? buf_g : ft_arena_take(ar, (size_t)acts_u);
    void *buf_d = ft_arena_take(ar, (size_t)acts_d);
    float *h = ft_arena_take(ar, (size_t)P * I * 4);
    uint16_t *hb = ft_arena_take(ar, (size_t)P * I * 2);
    uint8_t *thread_mem = ft_arena_take(ar, per_thread * nt);
    float *out = a->out ? a->out : ft_arena_take(ar, (size_t)T * D * 4); /* only the rounded result wanted */
    const int D2 = 2 * I, glu_kind = a->glu;
    const float alpha = a->alpha, limit = a->limit;

#pragma omp parallel num_threads(nt)
    {
        const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        ft_acts ag, au, ad; /* each thread's own view of the shared buffers (same fields in every thread): no thread
                             * ever reads a struct another one is writing */
        float *scr = (float *)(thread_mem + per_thread * tid);
        float *gv = scr + rs, *uv = gv + (size_t)step * T, *yv = uv + (size_t)step * T;
        int32_t *pidx = (int32_t *)(yv + (size_t)step * T);
        int64_t lo, hi;

        /* activations of x for gate and up: each thread a slice of tokens */
        slice(T, tid, nth, &lo, &hi);
        ft_prepare(G, pg, a->x, a->x_kind, Din, NULL, T, (int)lo, (int)(hi - lo), buf_g, &ag);
        if (!share) ft_prepare(U, pu, a->x, a->x_kind, Din, NULL, T, (int)lo, (int)(hi - lo), buf_u, &au);
        else au = ag;
#pragma omp barrier
        /* gate / up rows [lo, hi) of every taken expert -> h */
        slice(I, tid, nth, &lo, &hi);
        int next = 0;
        for (int e = 0; e < E; e++) {
            int n = start[e + 1] - start[e];
            if (!n) continue;
            for (next = e + 1; next < E && start[next + 1] == start[next]; next++) {}
            prefetch_rows(G, next < E ? next : -1, lo);
            prefetch_rows(U, next < E ? next : -1, lo);
            const int32_t *toks = pair_tok + start[e];
            const float *bg = a->b_gate_up ? a->b_gate_up + (int64_t)e * D2 : NULL;
            for (int64_t j0 = lo; j0 < hi; j0 += step) {
                const int64_t j1 = j0 + step < hi ? j0 + step : hi, m = (j1 - j0) * n;
                ft_rows_dot(G, e, (int)j0, (int)j1, &ag, toks, n, gv, n, scr);
                ft_rows_dot(U, e, (int)j0, (int)j1, &au, toks, n, uv, n, scr);
                if (bg)
                    for (int64_t j = j0; j < j1; j++)
                        for (int i = 0; i < n; i++) gv[(j - j0) * n + i] += bg[j], uv[(j - j0) * n + i] += bg[I + j];
#pragma omp simd
                for (int64_t q = 0; q < m; q++) gv[q] = glu(gv[q], uv[q], glu_kind, alpha, limit);
                for (int64_t j = j0; j < j1; j++)
                    for (int i = 0; i < n; i++) h[(int64_t)(start[e] + i) * I + j] = gv[(j - j0) * n + i];
            }
        }
#pragma omp barrier
        /* h rounded to the activation dtype, then laid out for the down matrix: each thread a slice of pairs */
        slice(P, tid, nth, &lo, &hi);
        if (pd == FT_PATH_B) {
            for (int64_t i = lo * I; i < hi * I; i++) h[i] = ft_round_act(h[i], a->x_kind);
            ft_prepare(W2, pd, h, FT_F32, I, NULL, (int)P, (int)lo, (int)(hi - lo), buf_d, &ad);
        } else {
            for (int64_t i = lo * I; i < hi * I; i++) hb[i] = ft_f32_to_bf16(h[i]);
            ft_prepare(W2, pd, hb, FT_BF16, I, NULL, (int)P, (int)lo, (int)(hi - lo), buf_d, &ad);
        }
#pragma omp barrier
        /* down rows [lo, hi) of every taken expert, weighted into out */
        slice(D, tid, nth, &lo, &hi);
        for (int t = 0; t < T; t++) memset(out + (int64_t)t * D + lo, 0, (size_t)(hi - lo) * 4);
        for (int e = 0; e < E; e++) {
            int n = start[e + 1] - start[e];
            if (!n) continue;
            int nx = e + 1;
            while (nx < E && start[nx + 1] == start[nx]) nx++;
            prefetch_rows(W2, nx < E ? nx : -1, lo);
            for (int i = 0; i < n; i++) pidx[i] = start[e] + i;
            const float *bd = a->b_down ? a->b_down + (int64_t)e * D : NULL;
            for (int64_t r0 = lo; r0 < hi; r0 += step) {
                const int64_t r1 = r0 + step < hi ? r0 + step : hi;
                ft_rows_dot(W2, e, (int)r0, (int)r1, &ad, pidx, n, yv, n, scr);
                for (int i = 0; i < n; i++) {
                    const int64_t p = start[e] + i;
                    const float wt = a->weights[(int64_t)pair_tok[p] * K + pair_k[p]];
                    float *o = out + (int64_t)pair_tok[p] * D;
                    for (int64_t r = r0; r < r1; r++) o[r] += wt * (yv[(r - r0) * n + i] + (bd ? bd[r] : 0.0f));
                }
            }
        }
        if (a->out_cast) /* each thread rounds its own rows */
            for (int t = 0; t < T; t++)
                for (int64_t r = lo; r < hi; r++)
                    ft_store_act(a->out_cast, a->out_kind, (int64_t)t * D + r, out[(int64_t)t * D + r]);
    }
    return FT_OK;
}
