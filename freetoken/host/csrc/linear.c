/* A dense projection y = x W^T (+ bias) for a few rows of x (decode: the attention projections, routers, LM head)
 * at memory speed: each thread streams a slice of W's rows once for all rows of x, in the weights' own format. */
#include <omp.h>
#include <string.h>
#include "arena.h"
#include "ftk.h"

int ft_linear(const ft_linear_args *a) {
    const ft_matrix *W = a->w;
    const int T = a->T, N = W->rows;
    const int nt = a->threads > 0 ? a->threads : 1;
    const int path = ft_path_for(W, a->x_kind, a->generic);
    const int64_t per_thread = ft_rows_scratch_floats(W) + (int64_t)FT_ROW_BLOCK * T + 16;
    ft_arena *ar = ft_arena_reset((size_t)ft_acts_bytes(W, path, T) + (size_t)nt * per_thread * 4);
    if (!ar) return FT_ENOMEM;
    void *buf = ft_arena_take(ar, (size_t)ft_acts_bytes(W, path, T));
    float *thread_mem = ft_arena_take(ar, (size_t)nt * per_thread * 4);
    ft_acts acts;
    ft_prepare(W, path, a->x, a->x_kind, a->x_stride, NULL, T, 0, T, buf, &acts);
#pragma omp parallel num_threads(nt)
    {
        const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        float *scr = thread_mem + per_thread * tid, *y = scr + ft_rows_scratch_floats(W);
        int64_t lo = (int64_t)N * tid / nth, hi = (int64_t)N * (tid + 1) / nth;
        for (int64_t r0 = lo; r0 < hi; r0 += FT_ROW_BLOCK) {
            const int64_t r1 = r0 + FT_ROW_BLOCK < hi ? r0 + FT_ROW_BLOCK : hi;
            ft_rows_dot(W, 0, (int)r0, (int)r1, &acts, NULL, T, y, T, scr);
            for (int64_t r = r0; r < r1; r++) {
                const float b = a->bias ? a->bias[r] : 0.0f;
                for (int t = 0; t < T; t++)
                    ft_store_act(a->out, a->out_kind, (int64_t)t * a->out_stride + r, y[(r - r0) * T + t] + b);
            }
        }
    }
    return FT_OK;
}

int ft_caps(void) { return ft_path_a_built(); }
