/* Path Q's driver, included by rows_int8.c (AVX512-VNNI) and rows_int8_avx2.c (AVX2) after each defines its
 * quantize_chunk, q8_tile, q_zero_products, q_fold_d and, where it has one, Q_DECODE_BLOCK (its own decode of a
 * block of rows of one layout): the activations quantized chunk by chunk; per block of rows
 * the scales, the zero products s * z and (decode) the scales times the activation's d, then the tiles;
 * rows_int8.c's comments say why each piece is as it is. */
#pragma once

void ft_prepare_q(const ft_matrix *m, const void *x, int32_t x_kind, int64_t x_stride, const int32_t *rows, int n,
                  int first, int count, void *buf, ft_acts *a) {
    (void)x_kind; /* bf16: ft_path_for takes path Q for bf16 activations only */
    const int K = m->cols, U = ft_q_unit_of(m), nu = K / U, per_chunk = 128 / U;
    int8_t *xq = (int8_t *)buf;
    float *xd = (float *)(((uintptr_t)(xq + (int64_t)n * K) + 63) & ~(uintptr_t)63);
    float *xza = xd + (int64_t)n * nu + 16;
    a->kpad = K;
    a->ngroups = nu;
    a->xb = (const uint16_t *)xq;
    a->xd = xd;
    a->xsum = xza;
    for (int i = first; i < first + count; i++) {
        const uint16_t *src = (const uint16_t *)x + (int64_t)(rows ? rows[i] : i) * x_stride;
        for (int c = 0; c < K / 128; c++)
            quantize_chunk(src + 128 * c, U, xq + (int64_t)i * K + 128 * c, xd + (int64_t)i * nu + c * per_chunk,
                           xza + (int64_t)i * nu + c * per_chunk, m->kind == FT_INT8);
    }
}


static inline __attribute__((always_inline)) void rows_dot_q(const ft_matrix *m, int e, int r0, int r1,
                                                             const ft_acts *a, const int32_t *idx, int n, float *y,
                                                             int ldy, float *scratch, const int W8) {
    const int K = m->cols, U = ft_q_unit_of(m), nu = K / U, ng = m->scale_cols, per_group = m->group / U;
    const uint8_t *base = m->data + (int64_t)e * m->data_stride;
    const int8_t *xq = (const int8_t *)a->xb;
    float *sc = scratch, *su = sc + (int64_t)FT_ROW_BLOCK * ng + 16, *zs = su + (int64_t)FT_ROW_BLOCK * nu + 32;
    float *sd = zs + (int64_t)FT_ROW_BLOCK * nu + 32;
    for (int b0 = r0; b0 < r1; b0 += FT_ROW_BLOCK) {
        const int b1 = b0 + FT_ROW_BLOCK < r1 ? b0 + FT_ROW_BLOCK : r1;
        ft_prefetch_scales(m, e, b1, b1 + FT_ROW_BLOCK); /* the next block's, past r1 too: the MoE layer asks one
                                                           * block per call */
        ft_scales_block(m, e, b0, b1, sc);
        const uint8_t *z = m->zeros + (int64_t)e * m->zeros_stride + (int64_t)b0 * ng;
        const int64_t cells = (int64_t)(b1 - b0) * nu;
#ifdef Q_DECODE_BLOCK
        if (n == 1 && !W8 && per_group == 1 && U == 128) { /* decode, one unit per group of 128: the file's own, from
                                                           * the scales and zeros as they are */
            const int64_t t0 = idx ? idx[0] : 0;
            Q_DECODE_BLOCK(base + (int64_t)b0 * m->row_bytes, m->row_bytes, K, b1 - b0, sc, z, xq + t0 * K,
                           a->xd + t0 * nu, a->xsum + t0 * nu, y + (int64_t)(b0 - r0) * ldy, ldy);
            continue;
        }
#endif
        if (per_group == 1) { /* units are the groups: the scales as they are */
            su = sc;
            q_zero_products(sc, z, zs, cells);
        } else {
            su = sc + (int64_t)FT_ROW_BLOCK * ng + 16;
            for (int64_t j = 0, i = 0; j < b1 - b0; j++)
                for (int g = 0; g < ng; g++)
                    for (int p = 0; p < per_group; p++, i++) su[i] = sc[j * ng + g], zs[i] = sc[j * ng + g] * (float)z[j * ng + g];
        }
        memset(su + cells, 0, 16 * 4); /* the tiles read factors up to 16 units past a row's last */
        int r = b0;
        if (n == 1 && !W8) { /* decode: the activation's d folded into the scales, four rows at a time (int8 rows
                               * stream one at a time below, as bf16 rows do: the 32000 x 1024 head read in 1.4-1.6
                               * ms that way against 2.0 four at a time, and with software prefetch 1.6-1.8) */
            const int64_t t0 = idx ? idx[0] : 0;
            const int8_t *x[1] = {xq + t0 * K};
            const float *xd0 = a->xd + t0 * nu, *xza[1] = {a->xsum + t0 * nu};
            q_fold_d(su, xd0, sd, b1 - b0, nu);
            memset(sd + cells, 0, 16 * 4);
            for (; r + 4 <= b1; r += 4) {
                const float *s4[4], *z4[4];
                for (int j = 0; j < 4; j++) s4[j] = sd + (int64_t)(r + j - b0) * nu, z4[j] = zs + (int64_t)(r + j - b0) * nu;
                q8_tile(base + (int64_t)r * m->row_bytes, m->row_bytes, K, U, s4, z4, x, NULL, xza,
                        y + (int64_t)(r - r0) * ldy, ldy, 1, 4, 1, 1, W8);
            }
        }
        const int chunk = ft_tokens_per_pass(K, 4), rb = r; /* int8 activations, four per q8_tile (ftk.h) */
        for (int i0 = 0; i0 < n; i0 += chunk) {
            const int i1 = i0 + chunk < n ? i0 + chunk : n;
            for (r = rb; r < b1; r++) {
                const float *s1[1] = {su + (int64_t)(r - b0) * nu}, *z1[1] = {zs + (int64_t)(r - b0) * nu};
                for (int i = i0; i < i1; i += 4) {
                    const int nt = i1 - i < 4 ? i1 - i : 4;
                    const int8_t *x[4];
                    const float *xd[4], *xza[4];
                    for (int t = 0; t < nt; t++) {
                        const int64_t row = idx ? idx[i + t] : i + t;
                        x[t] = xq + row * K, xd[t] = a->xd + row * nu, xza[t] = a->xsum + row * nu;
                    }
                    float *yr = y + (int64_t)(r - r0) * ldy + i;
                    const uint8_t *q = base + (int64_t)r * m->row_bytes;
                    switch (nt) {
                    case 1: q8_tile(q, m->row_bytes, K, U, s1, z1, x, xd, xza, yr, ldy, 1, 1, 1, 0, W8); break;
                    case 2: q8_tile(q, m->row_bytes, K, U, s1, z1, x, xd, xza, yr, ldy, 1, 1, 2, 0, W8); break;
                    case 3: q8_tile(q, m->row_bytes, K, U, s1, z1, x, xd, xza, yr, ldy, 1, 1, 3, 0, W8); break;
                    default: q8_tile(q, m->row_bytes, K, U, s1, z1, x, xd, xza, yr, ldy, 1, 1, 4, 0, W8);
                    }
                }
            }
        }
    }
}

void ft_rows_dot_q(const ft_matrix *m, int e, int r0, int r1, const ft_acts *a, const int32_t *idx, int n,
                   float *y, int ldy, float *scratch) {
    if (m->kind == FT_INT8) rows_dot_q(m, e, r0, r1, a, idx, n, y, ldy, scratch, 1);
    else rows_dot_q(m, e, r0, r1, a, idx, n, y, ldy, scratch, 0);
}

