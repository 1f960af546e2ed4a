/* Path Q: int4 weights against int8-quantized activations (AVX512-VNNI or AVX2), where the compiler targets a CPU
 * that has it and int8 activations are on (ft_set_int8_acts; the default). */
#pragma once
#include "ftk.h"

/* which path Q this build holds: rows_int8.c's (AVX512-VNNI), rows_int8_avx2.c's (AVX2), or none */
#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__) && defined(__AVX512BW__) && !defined(FT_NO_AVX512)
#define FT_Q_AVX512 1
#endif

/* columns per int8 activation scale: the weights' group, at most one 128-column chunk */
static inline int ft_q_unit_of(const ft_matrix *m) { return m->group < 128 ? m->group : 128; }

int ft_path_q_built(void); /* 0: none, 1: AVX512-VNNI, 2: AVX2 */
/* the activation unit (columns per int8 scale) path Q reads this matrix with, or 0: it does not take it */
int ft_path_q_unit(const ft_matrix *m);
void ft_set_int8_acts(int32_t on);
int64_t ft_acts_q_bytes(const ft_matrix *m, int n);
void ft_prepare_q(const ft_matrix *m, const void *x, int32_t x_kind, int64_t x_stride, const int32_t *rows, int n,
                  int first, int count, void *buf, ft_acts *a);
void ft_rows_dot_q(const ft_matrix *m, int e, int r0, int r1, const ft_acts *a, const int32_t *idx, int n,
                   float *y, int ldy, float *scratch);
int64_t ft_rows_scratch_q_floats(const ft_matrix *m);
