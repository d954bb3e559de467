/* The collective matrix every communicator must pass: each collective x
 * dtype x op x size, on ordinary and on lk_comm_alloc_shared memory,
 * checked element by element against a double-precision reference computed
 * locally from (rank, world, seed). All-reduce result hashes are recorded so
 * callers can compare them across ranks, buffer kinds and runs. */
#ifndef LK_TEST_COLL_CHECK_H
#define LK_TEST_COLL_CHECK_H

#include "dist_util.h"

static const lk_dtype cc_dtypes[] = {LK_F32, LK_F64, LK_BF16, LK_F16, LK_I32, LK_I64};
#define CC_NDT 6

typedef struct {
    int errors;
    uint64_t *hashes;
    int nhash;
} cc_ctx;

static inline int cc_report(cc_ctx *x, const char *what, lk_dtype dt, size_t n, int op, size_t i, double got, double want) {
    if (x->errors++ < 8)
        fprintf(stderr, "[rank %d] %s %s n=%zu op=%d: element %zu = %.17g, expected %.17g\n", lk_log_rank(), what,
                lk_dtype_name(dt), n, op, i, got, want);
    return 1;
}

static inline void *cc_alloc(lk_comm *c, size_t bytes, bool shared) {
    void *p = NULL;
    if (shared) {
        if (lk_comm_alloc_shared(c, bytes, &p)) return NULL;
    } else {
        p = lk_aligned_alloc(64, bytes ? bytes : 64);
    }
    return p;
}
static inline void cc_free(lk_comm *c, void *p, bool shared) {
    if (shared) lk_comm_free_shared(c, p);
    else lk_aligned_free(p);
}

#define CC_OK(call)                                                                        \
    do {                                                                                   \
        lk_status st_ = (call);                                                            \
        if (st_) {                                                                         \
            fprintf(stderr, "[rank %d] %s failed: %s\n", r, #call, lk_last_error());       \
            x->errors++;                                                                   \
            goto done;                                                                     \
        }                                                                                  \
    } while (0)

static inline void cc_all_reduce(lk_comm *c, cc_ctx *x, lk_dtype dt, size_t n, lk_reduce_op op, bool shared, uint64_t seed) {
    int r = lk_comm_rank(c), W = lk_comm_world_size(c);
    size_t esz = lk_dtype_size(dt);
    void *buf = cc_alloc(c, n * esz, shared);
    if (!buf) {
        x->errors++;
        return;
    }
    du_fill(buf, dt, seed, r, n);
    CC_OK(lk_comm_all_reduce(c, buf, n, dt, op));
    for (size_t i = 0; i < n; i++) {
        double want = du_ref_reduce(dt, op, seed, W, i), got = du_load(buf, dt, i);
        if (!(fabs(got - want) <= du_tol(dt, want, W))) {
            cc_report(x, shared ? "all_reduce(shared)" : "all_reduce", dt, n, op, i, got, want);
            break;
        }
    }
    if (x->hashes && x->nhash < DU_NRES) x->hashes[x->nhash++] = du_hash(buf, n * esz);
done:
    cc_free(c, buf, shared);
}

static inline void cc_others(lk_comm *c, cc_ctx *x, lk_dtype dt, size_t n, bool shared, uint64_t seed) {
    int r = lk_comm_rank(c), W = lk_comm_world_size(c);
    size_t esz = lk_dtype_size(dt);
    int root = (int)(n % (size_t)W);
    void *a = cc_alloc(c, n * esz * (size_t)W, shared), *b = cc_alloc(c, n * esz * (size_t)W, shared);
    if (!a || !b) {
        x->errors++;
        goto done;
    }
    /* broadcast from root */
    du_fill(a, dt, r == root ? seed : seed + 99, r, n);
    CC_OK(lk_comm_broadcast(c, a, n, dt, root));
    for (size_t i = 0; i < n; i++)
        if (du_load(a, dt, i) != du_value(dt, seed, root, i)) {
            cc_report(x, "broadcast", dt, n, root, i, du_load(a, dt, i), du_value(dt, seed, root, i));
            break;
        }
    /* all_gather */
    du_fill(a, dt, seed, r, n);
    CC_OK(lk_comm_all_gather(c, a, b, n, dt));
    for (int k = 0; k < W; k++)
        for (size_t i = 0; i < n; i++)
            if (du_load(b, dt, (size_t)k * n + i) != du_value(dt, seed, k, i)) {
                cc_report(x, "all_gather", dt, n, k, i, du_load(b, dt, (size_t)k * n + i), du_value(dt, seed, k, i));
                k = W;
                break;
            }
    /* reduce_scatter, every op */
    for (int op = 0; op < LK_REDUCE_COUNT; op++) {
        du_fill(a, dt, seed + 7, r, n * (size_t)W);
        CC_OK(lk_comm_reduce_scatter(c, a, b, n, dt, (lk_reduce_op)op));
        for (size_t i = 0; i < n; i++) {
            double want = du_ref_reduce(dt, (lk_reduce_op)op, seed + 7, W, (size_t)r * n + i), got = du_load(b, dt, i);
            if (!(fabs(got - want) <= du_tol(dt, want, W))) {
                cc_report(x, "reduce_scatter", dt, n, op, i, got, want);
                break;
            }
        }
    }
    /* gather to root */
    du_fill(a, dt, seed + 3, r, n);
    CC_OK(lk_comm_gather(c, a, b, n, dt, root));
    if (r == root)
        for (int k = 0; k < W; k++)
            for (size_t i = 0; i < n; i++)
                if (du_load(b, dt, (size_t)k * n + i) != du_value(dt, seed + 3, k, i)) {
                    cc_report(x, "gather", dt, n, k, i, du_load(b, dt, (size_t)k * n + i), du_value(dt, seed + 3, k, i));
                    k = W;
                    break;
                }
    /* scatter from root: block k of root's send goes to rank k */
    if (r == root)
        for (int k = 0; k < W; k++)
            for (size_t i = 0; i < n; i++) du_store(a, dt, (size_t)k * n + i, du_value(dt, seed + 5, k, i));
    CC_OK(lk_comm_scatter(c, a, b, n, dt, root));
    for (size_t i = 0; i < n; i++)
        if (du_load(b, dt, i) != du_value(dt, seed + 5, r, i)) {
            cc_report(x, "scatter", dt, n, root, i, du_load(b, dt, i), du_value(dt, seed + 5, r, i));
            break;
        }
    CC_OK(lk_comm_barrier(c));
done:
    if (a) cc_free(c, a, shared);
    if (b) cc_free(c, b, shared);
}

/* The whole matrix; `big` adds multi-megabyte all-reduces. Returns errors. */
static inline int cc_check_all(lk_comm *c, uint64_t seed, bool big, uint64_t *hashes, int *nhash) {
    cc_ctx x = {0, hashes, 0};
    static const size_t sizes[] = {0, 1, 7, 1023, 40000};
    for (int d = 0; d < CC_NDT; d++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            for (int op = 0; op < LK_REDUCE_COUNT; op++)
                for (int sh = 0; sh < 2; sh++) cc_all_reduce(c, &x, cc_dtypes[d], sizes[s], (lk_reduce_op)op, sh, seed + (uint64_t)s);
            cc_others(c, &x, cc_dtypes[d], sizes[s], (d + (int)s) & 1, seed + (uint64_t)s);
        }
    if (big) {
        static const lk_dtype bdt[] = {LK_F32, LK_BF16, LK_F64, LK_I64};
        static const lk_reduce_op bop[] = {LK_REDUCE_SUM, LK_REDUCE_AVG, LK_REDUCE_MAX, LK_REDUCE_SUM};
        for (int i = 0; i < 4; i++)
            for (int sh = 0; sh < 2; sh++) cc_all_reduce(c, &x, bdt[i], 600001, bop[i], sh, seed + 1000);
        cc_others(c, &x, LK_F32, 300001, false, seed + 2000);
        cc_others(c, &x, LK_F32, 300001, true, seed + 2000);
    }
    if (nhash) *nhash = x.nhash;
    return x.errors;
}

#endif
