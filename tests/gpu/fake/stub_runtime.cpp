/* A stand-in for the fake CUDA runtime's side of fake.h, for the fake
 * cuBLASLt's unit test (test_fake_cublaslt.cpp) alone. "Device" buffers are
 * mmap'd pages kept PROT_NONE except while queued work runs, so that a
 * matmul that reads or writes them at call time, rather than inside the
 * function it queues, crashes the test instead of passing. Work is queued
 * and runs only at lk_stub_sync, so that values read at call time (alpha,
 * beta) are told apart from values read later. Stream NULL is refused, as
 * the fake runtime refuses the legacy stream. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <vector>

#include "fake.h"

namespace {
struct Region {
    char *p;
    size_t n, len;
    int device;
}; /* n asked for, len mapped */
std::vector<Region> regions;
std::vector<std::function<void()>> queued;

void protect(int prot) {
    for (const Region &r : regions)
        if (mprotect(r.p, r.len, prot) != 0) {
            perror("stub_runtime: mprotect");
            abort();
        }
}
} // namespace

/* The test's side, C linkage so that a C test can use it too. */
extern "C" {
/* A new device buffer of n bytes (page aligned, so 256-byte aligned) on GPU device. */
void *lk_stub_alloc(size_t n, int device) {
    size_t len = n ? (n + 4095) / 4096 * 4096 : 4096;
    void *p = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("stub_runtime: mmap");
        abort();
    }
    regions.push_back(Region{(char *)p, n, len, device});
    return p;
}

void lk_stub_free(void *p) {
    for (size_t i = 0; i < regions.size(); i++)
        if (regions[i].p == p) {
            munmap(regions[i].p, regions[i].len);
            regions.erase(regions.begin() + (ptrdiff_t)i);
            return;
        }
}

/* Host <-> device copies; dst or src is device memory. */
void lk_stub_copy(void *dst, const void *src, size_t n) {
    protect(PROT_READ | PROT_WRITE);
    memcpy(dst, src, n);
    protect(PROT_NONE);
}

/* Runs the queued work in order; returns how many ran. */
int lk_stub_sync(void) {
    int n = (int)queued.size();
    protect(PROT_READ | PROT_WRITE);
    for (auto &f : queued) f();
    protect(PROT_NONE);
    queued.clear();
    return n;
}
} // extern "C"

int lk_fake_enqueue(void *s, const char *what, std::function<void()> fn) {
    (void)what;
    if (!s) return 400; /* cudaErrorInvalidResourceHandle: the legacy stream */
    queued.push_back(std::move(fn));
    return 0;
}

bool lk_fake_is_device(const void *p, size_t n, int *device) {
    const char *c = (const char *)p;
    for (const Region &r : regions)
        if (c >= r.p && n <= r.n && c - r.p <= (ptrdiff_t)(r.n - n)) {
            if (device) *device = r.device;
            return true;
        }
    return false;
}
