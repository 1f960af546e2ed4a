/* Branch-free expf the compiler vectorises inside `omp simd` loops (Cody-Waite reduction, degree-6 polynomial:
 * within 2 ulp of expf on [-87, 88]; below -87 it returns ~1e-38 instead of a subnormal, which every caller
 * (softmax, sigmoid) adds to numbers >= 1). */
#pragma once
#include <math.h>
#include <stdint.h>

static inline float ft_expf(float x) {
    x = x < -87.0f ? -87.0f : x > 88.5f ? 88.5f : x; /* plain compares: fminf / fmaxf would be libm calls */
    const float n = nearbyintf(x * 1.44269504088896341f);
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p * r, r, r) + 1.0f;
    union { int32_t i; float f; } s = {((int32_t)n + 127) << 23};
    return p * s.f;
}
