/* Process groups and point-to-point, checked the same way on every
 * communicator (test_dist_group.c forks shm ranks, test_dist_mpi.c runs
 * them under mpirun): a 2 x 2 mesh whose data-parallel groups all-reduce
 * while its pipeline stages send to each other, a split of a split with
 * negative colours, and the exchange pattern (both ranks send and receive
 * at once) through the async forms. Each function returns the number of
 * failed checks on this rank and prints what failed. */
#ifndef LK_TEST_GROUP_CHECK_H
#define LK_TEST_GROUP_CHECK_H

#include <stdio.h>
#include <string.h>

#include "comm/comm_impl.h"

#define GC_FAIL(...)                                         \
    do {                                                     \
        fprintf(stderr, "[group_check] " __VA_ARGS__);       \
        fprintf(stderr, " (%s:%d)\n", __FILE__, __LINE__);   \
        errors++;                                            \
    } while (0)

/* Element i of the message from `src` in round `round`: exact in every dtype. */
static inline double gc_val(lk_dtype dt, int src, int round, size_t i) {
    long v = (long)((i * 7 + (size_t)src * 13 + (size_t)round * 5) % 97) - 48;
    return dt == LK_U8 ? (double)(v + 48) : (double)v;
}

static inline void gc_put(void *b, lk_dtype dt, size_t i, double v) {
    switch (dt) {
    case LK_F32: ((float *)b)[i] = (float)v; break;
    case LK_F64: ((double *)b)[i] = v; break;
    case LK_BF16: ((uint16_t *)b)[i] = lk_f32_to_bf16_bits((float)v); break;
    case LK_F16: ((uint16_t *)b)[i] = lk_f32_to_f16_bits((float)v); break;
    case LK_I32: ((int32_t *)b)[i] = (int32_t)v; break;
    case LK_I64: ((int64_t *)b)[i] = (int64_t)v; break;
    case LK_U8: ((uint8_t *)b)[i] = (uint8_t)v; break;
    default: break;
    }
}

static inline double gc_get(const void *b, lk_dtype dt, size_t i) {
    switch (dt) {
    case LK_F32: return ((const float *)b)[i];
    case LK_F64: return ((const double *)b)[i];
    case LK_BF16: return lk_bf16_bits_to_f32(((const uint16_t *)b)[i]);
    case LK_F16: return lk_f16_bits_to_f32(((const uint16_t *)b)[i]);
    case LK_I32: return ((const int32_t *)b)[i];
    case LK_I64: return (double)((const int64_t *)b)[i];
    case LK_U8: return ((const uint8_t *)b)[i];
    default: return 0;
    }
}

/* The 2 x 2 mesh on 4 ranks: in each round, every data-parallel group
 * all-reduces (async) while stage 0 sends to stage 1 and stage 1 sends
 * back (blocking, ordered: stage 0 sends first), then everything is
 * checked: the sum of the replicas' values, and the stage's payload. Sizes
 * from one element to several mailbox chunks, every dtype. */
static inline int gc_mesh(lk_comm *world) {
    int errors = 0;
    lk_comm_mesh_2d mesh;
    lk_status st = lk_comm_mesh_2d_create(world, 2, 2, &mesh);
    if (st) {
        GC_FAIL("mesh: %s", lk_last_error());
        return errors + 1;
    }
    int r = lk_comm_rank(world);
    if (mesh.dp_rank != r % 2 || mesh.pp_rank != r / 2 || lk_comm_rank(mesh.dp) != r % 2 ||
        lk_comm_rank(mesh.pp) != r / 2 || lk_comm_world_size(mesh.dp) != 2 || lk_comm_world_size(mesh.pp) != 2)
        GC_FAIL("rank %d: mesh ranks dp %d/%d pp %d/%d", r, lk_comm_rank(mesh.dp), lk_comm_world_size(mesh.dp),
                lk_comm_rank(mesh.pp), lk_comm_world_size(mesh.pp));
    const lk_dtype dts[] = {LK_F32, LK_BF16, LK_I64, LK_U8, LK_F64, LK_F16, LK_I32};
    const size_t sizes[] = {1, 1000, 300000};
    int round = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++, round++) {
            lk_dtype dt = dts[di];
            size_t n = sizes[si], esz = lk_dtype_size(dt);
            float *grad = lk_malloc(n * sizeof(float));
            void *out = lk_malloc(n * esz), *in = lk_malloc(n * esz);
            if (!grad || !out || !in) {
                GC_FAIL("out of memory");
                lk_free(grad), lk_free(out), lk_free(in);
                break;
            }
            for (size_t i = 0; i < n; i++) grad[i] = (float)(r * 1000 + (int)(i % 100) + round);
            for (size_t i = 0; i < n; i++) gc_put(out, dt, i, gc_val(dt, r, round, i));
            lk_work *w = NULL;
            st = lk_comm_all_reduce_async(mesh.dp, grad, n, LK_F32, LK_REDUCE_SUM, &w);
            if (st) GC_FAIL("rank %d: all_reduce_async: %s", r, lk_last_error());
            int peer = 1 - mesh.pp_rank, peer_world = peer * 2 + mesh.dp_rank;
            if (mesh.pp_rank == 0) {
                if (lk_comm_send(mesh.pp, out, n, dt, peer)) GC_FAIL("rank %d: send: %s", r, lk_last_error());
                if (lk_comm_recv(mesh.pp, in, n, dt, peer)) GC_FAIL("rank %d: recv: %s", r, lk_last_error());
            } else {
                if (lk_comm_recv(mesh.pp, in, n, dt, peer)) GC_FAIL("rank %d: recv: %s", r, lk_last_error());
                if (lk_comm_send(mesh.pp, out, n, dt, peer)) GC_FAIL("rank %d: send: %s", r, lk_last_error());
            }
            if (w && lk_work_wait(w)) GC_FAIL("rank %d: all_reduce: %s", r, lk_last_error());
            lk_work_free(w);
            /* dp group of stage s: world ranks 2s and 2s+1 */
            int a = mesh.pp_rank * 2, b = a + 1;
            for (size_t i = 0; i < n; i++) {
                float want = (float)(a * 1000 + b * 1000 + 2 * ((int)(i % 100) + round));
                if (grad[i] != want) {
                    GC_FAIL("rank %d round %d: dp all_reduce [%zu] = %g, expected %g", r, round, i, grad[i], want);
                    break;
                }
            }
            for (size_t i = 0; i < n; i++)
                if (gc_get(in, dt, i) != gc_val(dt, peer_world, round, i)) {
                    GC_FAIL("rank %d round %d: %s x %zu from rank %d: [%zu] = %g, expected %g", r, round, lk_dtype_name(dt),
                            n, peer_world, i, gc_get(in, dt, i), gc_val(dt, peer_world, round, i));
                    break;
                }
            lk_free(grad), lk_free(out), lk_free(in);
        }
    /* The world stays usable next to its groups. */
    int32_t one = 1;
    if (lk_comm_all_reduce(world, &one, 1, LK_I32, LK_REDUCE_SUM) || one != 4) GC_FAIL("world all_reduce after the mesh");
    lk_comm_mesh_2d_free(&mesh);
    return errors;
}

/* Both ranks of every pair send and receive at once with the async forms
 * (the pattern that deadlocks with blocking synchronous sends): ring
 * neighbours exchange 3 messages each way, several in flight per pair. */
static inline int gc_exchange(lk_comm *c) {
    int errors = 0, r = lk_comm_rank(c), W = lk_comm_world_size(c);
    int next = (r + 1) % W, prev = (r + W - 1) % W;
    enum { N = 70000, M = 3 };
    static double out[M][N], in[M][N];
    lk_work *ws[2 * M] = {0};
    /* A collective of the same communicator runs meanwhile, on its own thread. */
    enum { NC = 50000 };
    static float coll[NC];
    for (int i = 0; i < NC; i++) coll[i] = (float)(r + i % 10);
    lk_work *cw = NULL;
    if (lk_comm_all_reduce_async(c, coll, NC, LK_F32, LK_REDUCE_SUM, &cw)) GC_FAIL("all_reduce_async: %s", lk_last_error());
    for (int m = 0; m < M; m++) {
        for (int i = 0; i < N; i++) out[m][i] = gc_val(LK_F64, r, m, (size_t)i);
        if (lk_comm_send_async(c, out[m], N, LK_F64, next, &ws[2 * m])) GC_FAIL("send_async: %s", lk_last_error());
        if (lk_comm_recv_async(c, in[m], N, LK_F64, prev, &ws[2 * m + 1])) GC_FAIL("recv_async: %s", lk_last_error());
    }
    for (int k = 0; k < 2 * M; k++) {
        if (ws[k] && lk_work_wait(ws[k])) GC_FAIL("rank %d: work %d: %s", r, k, lk_last_error());
        lk_work_free(ws[k]);
    }
    if (cw && lk_work_wait(cw)) GC_FAIL("rank %d: all_reduce next to the sends: %s", r, lk_last_error());
    lk_work_free(cw);
    for (int i = 0; i < NC; i++)
        if (coll[i] != (float)(W * (W - 1) / 2 + W * (i % 10))) {
            GC_FAIL("rank %d: all_reduce next to the sends: [%d] = %g", r, i, coll[i]);
            break;
        }
    for (int m = 0; m < M; m++)
        for (int i = 0; i < N; i++)
            if (in[m][i] != gc_val(LK_F64, prev, m, (size_t)i)) {
                GC_FAIL("rank %d: message %d from %d: [%d] = %g", r, m, prev, i, in[m][i]);
                break;
            }
    /* A blocking call queues behind async ones of the same pair. */
    double x = r, y = -1;
    lk_work *w = NULL;
    if (lk_comm_send_async(c, &x, 1, LK_F64, next, &w)) GC_FAIL("send_async: %s", lk_last_error());
    if (lk_comm_recv(c, &y, 1, LK_F64, prev) || y != prev) GC_FAIL("rank %d: blocking recv behind async: %g", r, y);
    if (w && lk_work_wait(w)) GC_FAIL("send_async wait: %s", lk_last_error());
    lk_work_free(w);
    return errors;
}

/* Split of a split, with keys reversing the order and negative colours. */
static inline int gc_split(lk_comm *c) {
    int errors = 0, r = lk_comm_rank(c), W = lk_comm_world_size(c);
    lk_comm *g = NULL, *gg = NULL, *none = (lk_comm *)1;
    /* Colour r % 2, key -r: the group's ranks in reverse world order. */
    if (lk_comm_split(c, r % 2, -r, &g) || !g) {
        GC_FAIL("split: %s", lk_last_error());
        return errors;
    }
    int n = (W - r % 2 + 1) / 2, want = 0;
    for (int k = r + 2; k < W; k += 2) want++;
    if (lk_comm_world_size(g) != n || lk_comm_rank(g) != want)
        GC_FAIL("rank %d: group rank %d/%d, expected %d/%d", r, lk_comm_rank(g), lk_comm_world_size(g), want, n);
    int32_t sum = r;
    if (lk_comm_all_reduce(g, &sum, 1, LK_I32, LK_REDUCE_SUM)) GC_FAIL("group all_reduce: %s", lk_last_error());
    int32_t ref = 0;
    for (int k = r % 2; k < W; k += 2) ref += k;
    if (sum != ref) GC_FAIL("rank %d: group sum %d, expected %d", r, sum, ref);
    /* The group's rank 0 stays out of the second split. */
    int gr = lk_comm_rank(g);
    if (lk_comm_split(g, gr == 0 ? LK_COMM_NO_GROUP : 7, gr, &gg)) GC_FAIL("split of split: %s", lk_last_error());
    if (gr == 0 && gg) GC_FAIL("rank %d: a negative colour gave a group", r);
    if (gr > 0) {
        if (!gg || lk_comm_world_size(gg) != lk_comm_world_size(g) - 1 || lk_comm_rank(gg) != gr - 1)
            GC_FAIL("rank %d: split of split rank %d/%d", r, gg ? lk_comm_rank(gg) : -1, gg ? lk_comm_world_size(gg) : -1);
        else if (lk_comm_world_size(gg) > 1) {
            /* point-to-point inside the inner group */
            int32_t v = r, got = -1;
            int peer = lk_comm_rank(gg) == 0 ? 1 : 0;
            if (lk_comm_rank(gg) <= 1) {
                lk_work *w = NULL;
                if (lk_comm_send_async(gg, &v, 1, LK_I32, peer, &w) || lk_comm_recv(gg, &got, 1, LK_I32, peer) ||
                    lk_work_wait(w))
                    GC_FAIL("rank %d: p2p in split of split: %s", r, lk_last_error());
                lk_work_free(w);
            }
        }
    }
    /* Every rank with a negative colour: no group, OK. */
    if (lk_comm_split(c, -5, 0, &none) || none) GC_FAIL("rank %d: colour -5 gave %p", r, (void *)none);
    lk_comm_free(gg);
    lk_comm_free(g);
    return errors;
}

#endif
