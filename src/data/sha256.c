/* SHA-256 (FIPS 180-4), for verifying downloaded data sets, and
 * lk_data_fetch: download to a .part file, verify, rename into place. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "lockstep/data.h"

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void block(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++) w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = hh + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
}

void lk_sha256_init(lk_sha256 *s) {
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, iv, sizeof iv);
    s->len = 0;
    s->n = 0;
}

void lk_sha256_update(lk_sha256 *s, const void *data, size_t len) {
    const uint8_t *p = data;
    s->len += len;
    while (len) {
        size_t k = 64 - s->n < len ? 64 - s->n : len;
        memcpy(s->buf + s->n, p, k);
        s->n += k, p += k, len -= k;
        if (s->n == 64) {
            block(s->h, s->buf);
            s->n = 0;
        }
    }
}

void lk_sha256_final(lk_sha256 *s, char hex[65]) {
    uint64_t bits = s->len * 8;
    uint8_t pad = 0x80, zero = 0, lenb[8];
    lk_sha256_update(s, &pad, 1);
    while (s->n != 56) lk_sha256_update(s, &zero, 1);
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)(bits >> (56 - 8 * i));
    lk_sha256_update(s, lenb, 8);
    for (int i = 0; i < 8; i++) snprintf(hex + 8 * i, 9, "%08x", s->h[i]);
}

lk_status lk_sha256_file(const char *path, char hex[65]) {
    FILE *f = fopen(path, "rb");
    if (!f) return lk_error(LK_STATUS_IO, "cannot open '%s': %s", path, strerror(errno));
    lk_sha256 s;
    lk_sha256_init(&s);
    uint8_t buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) lk_sha256_update(&s, buf, n);
    bool err = ferror(f);
    fclose(f);
    if (err) return lk_error(LK_STATUS_IO, "reading '%s' failed", path);
    lk_sha256_final(&s, hex);
    return LK_STATUS_OK;
}

static bool hex_equal(const char *a, const char *b) {
    if (strlen(a) != 64 || strlen(b) != 64) return false;
    for (int i = 0; i < 64; i++) {
        char x = a[i] >= 'A' && a[i] <= 'F' ? (char)(a[i] + 32) : a[i];
        if (x != b[i]) return false;
    }
    return true;
}

lk_status lk_data_fetch(const char *url, const char *dest, const char *sha256_hex, long timeout_s) {
    char hex[65];
    if (sha256_hex && strlen(sha256_hex) != 64)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "fetch %s: expected a sha256 of 64 hex digits, got '%s'", url, sha256_hex);
    if (access(dest, R_OK) == 0) { /* already there: done when it verifies */
        if (!sha256_hex) return LK_STATUS_OK;
        if (!lk_sha256_file(dest, hex) && hex_equal(sha256_hex, hex)) return LK_STATUS_OK;
    }
    char part[4096];
    snprintf(part, sizeof part, "%s.part", dest);
    lk_status st = lk_data_download(url, part, timeout_s);
    if (st) {
        unlink(part);
        return st;
    }
    if (sha256_hex) {
        st = lk_sha256_file(part, hex);
        if (!st && !hex_equal(sha256_hex, hex))
            st = lk_error(LK_STATUS_IO, "download of %s is corrupt: sha256 %s, expected %s (nothing was written to %s)", url,
                          hex, sha256_hex, dest);
        if (st) {
            unlink(part);
            return st;
        }
    }
    if (rename(part, dest) != 0) {
        st = lk_error(LK_STATUS_IO, "cannot move %s into place as %s: %s", part, dest, strerror(errno));
        unlink(part);
    }
    return st;
}
