/* Cross-check with PyTorch (registered where /usr/bin/python3 exists, skipped
 * where it cannot import torch; CI installs python3-torch so it runs there):
 * lockstep writes every dtype, tests/ckpt/st_check.py reads the file with its
 * own struct+json reader (the checksums in the metadata are strings any
 * reader accepts; it recomputes each) and compares with torch/numpy, then
 * writes a file of its own (unaligned offsets, BOOL and I16 tensors, no
 * checksums) that lockstep reads back. */
#include <unistd.h>

#include "lk_test.h"
#include "io/safetensors.h"

static const struct {
    const char *name;
    lk_dtype dt;
    int ndim;
    int64_t shape[2];
} tensors[] = {
    {"a.f32", LK_F32, 2, {2, 3}}, {"b.f64", LK_F64, 1, {4}}, {"c.bf16", LK_BF16, 2, {3, 2}},
    {"d.f16", LK_F16, 1, {5}},    {"e.i32", LK_I32, 2, {2, 2}}, {"f.i64", LK_I64, 1, {3}},
    {"g.u8", LK_U8, 1, {7}},      {"h.scalar", LK_F32, 0, {0}}, {"i.empty", LK_F32, 2, {0, 3}},
};
#define N (int)(sizeof tensors / sizeof tensors[0])

/* The value both sides compute: small integers, exact in every dtype. */
static double expected(int t, int64_t i, bool unsigned_) {
    double v = (double)((i * 7 + t * 3) % 23);
    return unsigned_ ? v : v - 11;
}

static lk_tensor *make(int t, lk_dtype dt, int ndim, const int64_t *shape) {
    lk_tensor *f = lk_tensor_empty(LK_F32, ndim, shape);
    for (int64_t i = 0; i < f->numel; i++) ((float *)f->data)[i] = (float)expected(t, i, dt == LK_U8);
    lk_tensor *c = lk_tensor_cast(f, dt);
    lk_tensor_release(f);
    return c;
}

static void test_python_cross_check(void) {
    char dir[512], in[600], out[600], cmd[2048];
    if (system("/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1") != 0) {
        printf("SKIP test_python_cross_check: /usr/bin/python3 cannot import torch and numpy (install python3-torch)\n");
        return;
    }
    snprintf(dir, sizeof dir, "%s/lk_st_py_%d", LK_BUILD_DIR, (int)getpid());
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    CHECK(system(cmd) == 0);
    snprintf(in, sizeof in, "%s/lockstep.safetensors", dir);
    snprintf(out, sizeof out, "%s/python.safetensors", dir);
    lk_tensor *ts[N];
    lk_st_entry e[N];
    for (int i = 0; i < N; i++) {
        ts[i] = make(i, tensors[i].dt, tensors[i].ndim, tensors[i].shape);
        e[i] = (lk_st_entry){.name = tensors[i].name, .tensor = ts[i]};
    }
    lk_st_meta meta[] = {{"format", "pt"}, {"writer", "lockstep"}};
    CHECK_OK(lk_safetensors_write(in, e, N, meta, 2));
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/tests/ckpt/st_check.py' '%s' '%s'", LK_SOURCE_DIR, in, out);
    int rc = system(cmd);
    CHECK_MSG(rc == 0, "%s exited with %d", cmd, rc);

    lk_st_file *f = NULL;
    if (rc == 0) CHECK_OK(lk_safetensors_open(out, &f));
    if (f) {
        CHECK(!strcmp(lk_safetensors_meta(f, "source"), "python"));
        CHECK(lk_safetensors_verified(f) == 0); /* PyTorch's writer stores no checksums: opened with the note */
        static const struct {
            const char *name;
            int t;
            lk_dtype dt;
            int64_t n;
        } back[] = {{"u8_odd", 0, LK_U8, 5}, {"w.f32", 1, LK_F32, 6}, {"w.bf16", 2, LK_BF16, 4}, {"w.f16", 3, LK_F16, 4},
                    {"w.f64", 4, LK_F64, 3}, {"w.i64", 5, LK_I64, 2}, {"w.i32", 6, LK_I32, 3}};
        for (size_t k = 0; k < sizeof back / sizeof back[0]; k++) {
            const lk_st_info *info;
            CHECK_OK(lk_safetensors_get(f, back[k].name, &info));
            if (!info) continue;
            CHECK(info->dtype == (int)back[k].dt && info->numel == back[k].n);
            /* same dtype, and converted to f64 (through an aligned copy when the file is unaligned) */
            lk_tensor *same = lk_tensor_empty(back[k].dt, info->ndim, info->shape);
            lk_tensor *f64 = lk_tensor_empty(LK_F64, info->ndim, info->shape);
            CHECK_OK(lk_safetensors_read_into(f, back[k].name, same));
            bool is_float = lk_dtype_is_float(back[k].dt);
            if (is_float) CHECK_OK(lk_safetensors_read_into(f, back[k].name, f64));
            for (int64_t i = 0; i < back[k].n; i++) {
                double want = expected(back[k].t, i, back[k].dt == LK_U8);
                CHECK_MSG(lk_tensor_get(same, i) == want, "%s[%lld] = %g, want %g", back[k].name, (long long)i,
                          lk_tensor_get(same, i), want);
                if (is_float) CHECK(((double *)f64->data)[i] == want);
            }
            lk_tensor_release(same);
            lk_tensor_release(f64);
        }
        const lk_st_info *w = lk_safetensors_find(f, "w.f32");
        CHECK(w && (uintptr_t)w->data % 4 != 0); /* the python writer really left it unaligned */
        const lk_st_info *mask = lk_safetensors_find(f, "mask");
        CHECK(mask && mask->dtype == -1 && !memcmp(mask->data, "\1\0\1", 3));
        const lk_st_info *i16 = lk_safetensors_find(f, "w.i16");
        CHECK(i16 && i16->dtype == -1 && !strcmp(i16->dtype_name, "I16") && i16->nbytes == 4);
        lk_tensor *s = lk_tensor_zeros(LK_F32, 0, NULL);
        CHECK_OK(lk_safetensors_read_into(f, "scalar", s));
        CHECK(((float *)s->data)[0] == 2.5f);
        lk_tensor_release(s);
        lk_safetensors_close(f);
    }
    for (int i = 0; i < N; i++) lk_tensor_release(ts[i]);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

LK_TEST_MAIN(LK_TEST_CASE(test_python_cross_check))
