/* Path A: bf16 dot products (AVX512-BF16) over the packed bits, where the compiler targets a CPU that has them. */
#pragma once
#include "ftk.h"

int ft_path_a_supports(const ft_matrix *m);
void ft_prepare_a(const ft_matrix *m, int path, const void *x, int64_t x_stride, const int32_t *rows, int n,
                  int first, int count, void *buf, ft_acts *a);
void ft_rows_dot_a(const ft_matrix *m, int e, int r0, int r1, const ft_acts *a, const int32_t *idx, int n,
                   float *y, int ldy, float *scratch);

