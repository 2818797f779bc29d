/*
 * Check and decode many stored chunks in one call: the loop of
 * atari_zarr.storage.chunk_loop, loaded with ctypes (which releases the GIL for the
 * whole call, so threads decode at once).
 *
 * The loop uses no Python API: c-blosc2's blosc2_decompress_ctx and crc32c's
 * crc32c_value are passed in as function pointers, taken from the libraries
 * python-blosc2 and google-crc32c ship, so nothing is linked at build time. The file
 * is also an (empty) extension module, so that importing every module of the package
 * imports it too.
 */
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(_WIN32)
#define EXPORT __declspec(dllexport)
#else
#define EXPORT __attribute__((visibility("default")))
#endif

typedef int (*decompress_fn)(void *ctx, const void *src, int32_t srcsize, void *dest,
                             int32_t destsize);
typedef uint32_t (*crc_fn)(const uint8_t *data, size_t count);

/* What is wrong with a chunk, in status[i]; the caller names it. */
enum { OK = 0, TOO_SHORT = 1, BAD_CRC = 2, NOT_WHOLE = 3, WRONG_SIZE = 4, NO_DECODE = 5 };

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

/* Check chunk s (len bytes: a Blosc buffer, then its crc32c where crc is not NULL)
 * and decode it into destsize bytes at dest; its status. */
static int8_t decode_one(decompress_fn decompress, void *ctx, crc_fn crc, const uint8_t *s,
                         int64_t len, void *dest, int32_t destsize) {
    if (s == NULL) {
        return TOO_SHORT; /* not located: the caller reads it another way */
    }
    if (crc != NULL) {
        if (len < 20) {
            return TOO_SHORT;
        }
        if (crc(s, (size_t)(len - 4)) != le32(s + len - 4)) {
            return BAD_CRC;
        }
        len -= 4;
    } else if (len < 16) {
        return TOO_SHORT;
    }
    if ((int64_t)le32(s + 12) != len || len > INT32_MAX) {
        return NOT_WHOLE;
    }
    if ((int32_t)le32(s + 4) != destsize) {
        return WRONG_SIZE;
    }
    if (decompress(ctx, s, (int32_t)len, dest, destsize) != destsize) {
        return NO_DECODE;
    }
    return OK;
}

/*
 * Chunk i is srclen[i] bytes at address src[i]: a Blosc buffer, followed by its crc32c
 * (little-endian) when crc is not NULL. It decodes into destsize bytes at dest[i].
 * Returns the number of chunks not decoded; status[i] says why for each.
 */
EXPORT int64_t atari_zarr_decode_chunks(decompress_fn decompress, void *ctx, crc_fn crc,
                                        int64_t n, const uint64_t *src, const int64_t *srclen,
                                        const uint64_t *dest, int32_t destsize,
                                        int8_t *status) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        status[i] = decode_one(decompress, ctx, crc, (const uint8_t *)(uintptr_t)src[i],
                               srclen[i], (void *)(uintptr_t)dest[i], destsize);
        bad += status[i] != OK;
    }
    return bad;
}

/*
 * As atari_zarr_decode_chunks, but only some rows of each chunk are wanted: chunk i
 * decodes into the destsize bytes at scratch (reused, so it stays in the processor's
 * cache), and its rows within[p], for p in first[i] .. first[i] + count[i] - 1, are
 * copied (row_bytes each) to address out[p]. A chunk not decoded copies nothing.
 */
EXPORT int64_t atari_zarr_decode_rows(decompress_fn decompress, void *ctx, crc_fn crc,
                                      int64_t n, const uint64_t *src, const int64_t *srclen,
                                      int32_t destsize, uint8_t *scratch, const int64_t *first,
                                      const int64_t *count, const int64_t *within,
                                      const uint64_t *out, int64_t row_bytes, int8_t *status) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int8_t st = decode_one(decompress, ctx, crc, (const uint8_t *)(uintptr_t)src[i],
                               srclen[i], scratch, destsize);
        for (int64_t p = first[i]; st == OK && p < first[i] + count[i]; p++) {
            if (within[p] < 0 || (within[p] + 1) * row_bytes > (int64_t)destsize) {
                st = WRONG_SIZE; /* rows the chunk does not have: read another way */
            }
        }
        if (st == OK) {
            for (int64_t p = first[i]; p < first[i] + count[i]; p++) {
                memcpy((void *)(uintptr_t)out[p], scratch + within[p] * row_bytes,
                       (size_t)row_bytes);
            }
        }
        status[i] = st;
        bad += st != OK;
    }
    return bad;
}

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_chunk_loop",
    "The compiled chunk loop; atari_zarr.storage.chunk_loop calls it through ctypes.",
    0,
    NULL,
};

PyMODINIT_FUNC PyInit__chunk_loop(void) { return PyModule_Create(&module); }
