/* CRC-32C (Castagnoli, the iSCSI/ext4/safetensors-friendly polynomial
 * 0x1EDC6F41, reflected 0x82F63B78): the checksum every tensor of a
 * lockstep safetensors file carries. No installed dependency provides it
 * (zlib's crc32 is the other polynomial and runs at about 1 GB/s), so it is
 * here: x86-64's SSE4.2 crc32 instruction where cpuid says the CPU has it,
 * else a portable slicing-by-8 table.
 *
 * The instruction has a latency of 3 cycles and a throughput of 1, so one
 * dependent chain runs at a third of its speed: large buffers are cut in
 * three interleaved streams whose CRCs are joined with a "shift by N zero
 * bytes" operator (CRC registers are linear over GF(2): the register after
 * A||B equals the register after A shifted over |B| zero bytes, xor the
 * register after B started from 0). That is Mark Adler's well-known
 * construction, written again here. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "io/safetensors.h"

#define POLY 0x82F63B78u

/* ---- portable: slicing-by-8 ------------------------------------------------- */

static uint32_t slice8[8][256];

/* ---- the shift operators for the three-stream hardware path ------------------- */

#define LONG_BLOCK 8192u /* bytes per stream in a 24 KiB step */
#define SHORT_BLOCK 256u /* bytes per stream in a 768-byte step */
static uint32_t shift_long[4 * 256], shift_short[4 * 256]; /* [byte of the register][value] */

/* A 32x32 matrix over GF(2), one column per input bit, applied to a vector. */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    for (int i = 0; vec; i++, vec >>= 1)
        if (vec & 1) sum ^= mat[i];
    return sum;
}

static void gf2_square(uint32_t *sq, const uint32_t *mat) {
    for (int i = 0; i < 32; i++) sq[i] = gf2_times(mat, mat[i]);
}

/* The operator (a matrix) that feeds `len` zero bytes into a raw CRC
 * register, by squaring the one-zero-bit operator: O(log len). */
static void zeros_op(uint32_t op[32], size_t len) {
    uint32_t odd[32], even[32];
    /* one zero bit: shift right, fold in the polynomial */
    odd[0] = POLY;
    for (int i = 1; i < 32; i++) odd[i] = 1u << (i - 1);
    gf2_square(even, odd); /* two bits */
    gf2_square(odd, even); /* four bits */
    /* op starts as the identity; squaring walks 1, 2, 4, ... bytes */
    for (int i = 0; i < 32; i++) op[i] = 1u << i;
    uint32_t *sq = odd;
    uint32_t *other = even;
    while (len) {
        gf2_square(other, sq); /* other = sq^2: one byte, two bytes, ... */
        uint32_t *t = sq;
        sq = other;
        other = t;
        if (len & 1) {
            uint32_t next[32];
            for (int i = 0; i < 32; i++) next[i] = gf2_times(sq, op[i]);
            memcpy(op, next, sizeof next);
        }
        len >>= 1;
    }
}

/* The same operator for a fixed length as four byte-indexed tables (the
 * register's bytes contribute independently): four lookups per shift. */
static void zeros_tables(uint32_t *tab, size_t len) {
    uint32_t op[32];
    zeros_op(op, len);
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) tab[k * 256 + b] = gf2_times(op, b << (8 * k));
}

static uint32_t shift(const uint32_t *tab, uint32_t crc) {
    return tab[crc & 0xff] ^ tab[256 + ((crc >> 8) & 0xff)] ^ tab[512 + ((crc >> 16) & 0xff)] ^ tab[768 + (crc >> 24)];
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int have_hw;

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <nmmintrin.h>
#define LK_CRC_X86 1
#endif

static void init(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (POLY & (0u - (c & 1)));
        slice8[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; b++)
        for (int k = 1; k < 8; k++) slice8[k][b] = (slice8[k - 1][b] >> 8) ^ slice8[0][slice8[k - 1][b] & 0xff];
    zeros_tables(shift_long, LONG_BLOCK);
    zeros_tables(shift_short, SHORT_BLOCK);
#ifdef LK_CRC_X86
    unsigned a, b, c, d;
    have_hw = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_SSE4_2);
#endif
}

/* Raw register in, raw register out (no pre/post inversion). */
static uint32_t portable_raw(uint32_t crc, const unsigned char *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ slice8[0][(crc ^ *p++) & 0xff];
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8); /* little-endian hosts only: safetensors.c insists */
        w ^= crc;
        crc = slice8[7][w & 0xff] ^ slice8[6][(w >> 8) & 0xff] ^ slice8[5][(w >> 16) & 0xff] ^
              slice8[4][(w >> 24) & 0xff] ^ slice8[3][(w >> 32) & 0xff] ^ slice8[2][(w >> 40) & 0xff] ^
              slice8[1][(w >> 48) & 0xff] ^ slice8[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ slice8[0][(crc ^ *p++) & 0xff];
    return crc;
}

#ifdef LK_CRC_X86
__attribute__((target("sse4.2"))) static uint32_t hw_raw(uint32_t crc, const unsigned char *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        crc = _mm_crc32_u8(crc, *p++);
        n--;
    }
    uint64_t c0 = crc;
    /* three streams of LONG_BLOCK bytes, then of SHORT_BLOCK bytes */
    static const size_t blocks[2] = {LONG_BLOCK, SHORT_BLOCK};
    for (int s = 0; s < 2; s++) {
        size_t blk = blocks[s];
        while (n >= 3 * blk) {
            uint64_t c1 = 0, c2 = 0;
            const unsigned char *end = p + blk;
            do {
                uint64_t w0, w1, w2;
                memcpy(&w0, p, 8);
                memcpy(&w1, p + blk, 8);
                memcpy(&w2, p + 2 * blk, 8);
                c0 = _mm_crc32_u64(c0, w0);
                c1 = _mm_crc32_u64(c1, w1);
                c2 = _mm_crc32_u64(c2, w2);
                p += 8;
            } while (p < end);
            const uint32_t *tab = s == 0 ? shift_long : shift_short;
            c0 = shift(tab, (uint32_t)c0) ^ (uint32_t)c1;
            c0 = shift(tab, (uint32_t)c0) ^ (uint32_t)c2;
            p += 2 * blk;
            n -= 3 * blk;
        }
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c0 = _mm_crc32_u64(c0, w);
        p += 8;
        n -= 8;
    }
    crc = (uint32_t)c0;
    while (n--) crc = _mm_crc32_u8(crc, *p++);
    return crc;
}
#endif

uint32_t lk__crc32c_portable(uint32_t crc, const void *data, size_t n) {
    pthread_once(&once, init);
    return ~portable_raw(~crc, data, n);
}

uint32_t lk__crc32c(uint32_t crc, const void *data, size_t n) {
    pthread_once(&once, init);
#ifdef LK_CRC_X86
    if (have_hw) return ~hw_raw(~crc, data, n);
#endif
    return ~portable_raw(~crc, data, n);
}

uint32_t lk__crc32c_combine(uint32_t crc1, uint32_t crc2, size_t len2) {
    /* zlib's crc32_combine rule, which holds for the finished (inverted)
     * values too: crc(A||B) = zeros(|B|)(crc(A)) ^ crc(B) */
    uint32_t op[32];
    zeros_op(op, len2);
    return gf2_times(op, crc1) ^ crc2;
}

bool lk__crc32c_hardware(void) {
    pthread_once(&once, init);
    return have_hw != 0;
}
