/* One decode step of B sequences (a token each) through a stack of plain MoE layers in one call: per layer the
 * residual add and input RMSNorm, the qkv projection, attention_step, the output projection, the add and
 * post-attention RMSNorm, the router's projection and softmax top-k, and the layer's experts (ft_moe, rounded to the
 * activation dtype); then the add, the final RMSNorm and the LM head. Each step calls the entry point the op-by-op
 * path (freetoken/engine/model.py) calls, with the same arguments, so the logits are the same bit for bit. What it
 * saves is the Python between the calls, which runs with cold caches: every weight stream evicts the interpreter's
 * working set. Each layer's routing is left in its own [B, K] slots for the engine's bookkeeping (placement,
 * counters, recorder) after the call. */
#include <string.h>
#include "ftk.h"

typedef struct {
    const ft_linear_args *qkv, *o, *router; /* the weights' descriptors; the loop sets activations and threads */
    const ft_step_args *attn;               /* head counts, norms, rope, this sequence's caches and position */
    const ft_moe_args *moe;                 /* the layer's experts */
    const void *input_norm, *post_norm;     /* [D] RMSNorm weights, norm_kind */
    int32_t *ids; float *weights;           /* [B, K] out: this layer's routing */
} ft_decode_layer;

typedef struct {
    int32_t B, L, D, E, K, kind, norm_kind, round_normed, renormalize;
    float eps, route_scale;
    const ft_decode_layer *layers;
    void *x;            /* [B, D] the residual: in, the embedding rows; out, the last layer's */
    void *y, *h;        /* [B, D] a sublayer's output and a norm's, activation dtype */
    void *qkv, *q_buf, *attn, *logits; /* [B, (H + 2 Hkv) Dh], [B, H Dh], [B, H Dh], [B, E] */
    const void *final_norm;
    const ft_linear_args *head;
    void *out;          /* [B, V] the logits, activation dtype */
    int32_t threads;
} ft_decode_args;

/* x += y over n values, rounded to the activation dtype (torch's x + y) */
static void add_into(void *x, const void *y, int32_t kind, int64_t n) {
    for (int64_t i = 0; i < n; i++) ft_store_act(x, kind, i, ft_load_act(x, kind, i) + ft_load_act(y, kind, i));
}

static int linear(const ft_linear_args *w, const void *x, int T, void *out, int32_t kind, int32_t threads) {
    ft_linear_args a = *w;
    a.x = x, a.x_kind = kind, a.T = T, a.x_stride = a.w->cols;
    a.out = out, a.out_kind = kind, a.out_stride = a.w->rows, a.threads = threads, a.generic = 0;
    return ft_linear(&a);
}

#define TRY(call) do { const int rc_ = (call); if (rc_) return rc_; } while (0)

int ft_decode(const ft_decode_args *a) {
    const int B = a->B, D = a->D, kind = a->kind, nt = a->threads;
    const int64_t n = (int64_t)B * D;
    for (int l = 0; l < a->L; l++) {
        const ft_decode_layer *ly = &a->layers[l];
        if (l) add_into(a->x, a->y, kind, n);
        TRY(ft_rms_norm(a->x, kind, D, B, D, ly->input_norm, a->norm_kind, a->eps, a->round_normed, a->h, D, nt));
        TRY(linear(ly->qkv, a->h, B, a->qkv, kind, nt));
        ft_step_args s = *ly->attn;
        s.B = B, s.qkv = a->qkv, s.kind = kind, s.qkv_stride = ly->qkv->w->rows, s.q_buf = a->q_buf, s.out = a->attn;
        s.threads = nt;
        TRY(ft_attention_step(&s));
        TRY(linear(ly->o, a->attn, B, a->y, kind, nt));
        add_into(a->x, a->y, kind, n);
        TRY(ft_rms_norm(a->x, kind, D, B, D, ly->post_norm, a->norm_kind, a->eps, a->round_normed, a->h, D, nt));
        TRY(linear(ly->router, a->h, B, a->logits, kind, nt));
        TRY(ft_softmax_topk(a->logits, kind, B, a->E, a->K, a->renormalize, a->route_scale, ly->weights, ly->ids, nt));
        ft_moe_args m = *ly->moe;
        m.x = a->h, m.x_kind = kind, m.T = B, m.ids = ly->ids, m.weights = ly->weights, m.K = a->K, m.take = NULL;
        m.out = NULL, m.out_cast = a->y, m.out_kind = kind, m.threads = nt, m.generic = 0;
        TRY(ft_moe(&m));
    }
    add_into(a->x, a->y, kind, n);
    TRY(ft_rms_norm(a->x, kind, D, B, D, a->final_norm, a->norm_kind, a->eps, a->round_normed, a->h, D, nt));
    return linear(a->head, a->h, B, a->out, kind, nt);
}
