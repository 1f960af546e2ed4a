/* Per calling thread scratch that grows and is kept: a decode step's buffers are reused call after call (no page
 * faults per call), and two Python threads (the engine and its CPU-lane worker) never share one. */
#pragma once
#include <stdint.h>
#include <stdlib.h>

typedef struct { uint8_t *base; size_t size, used; } ft_arena;

static inline ft_arena *ft_arena_reset(size_t need) {
    static __thread ft_arena arena;
    need += 64 * 32; /* alignment slack for up to 32 pieces */
    if (arena.size < need) {
        free(arena.base);
        arena.size = need + need / 4;
        arena.size = (arena.size + 63) / 64 * 64;
        arena.base = (uint8_t *)aligned_alloc(64, arena.size);
        if (!arena.base) arena.size = 0;
    }
    arena.used = 0;
    return arena.base ? &arena : NULL;
}

static inline void *ft_arena_take(ft_arena *a, size_t n) {
    void *p = a->base + a->used;
    a->used += (n + 63) / 64 * 64;
    return p;
}
