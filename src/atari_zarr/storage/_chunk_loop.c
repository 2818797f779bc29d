/*
 * Check and decode many stored chunks in one call: the loop of
 * atari_zarr.storage.chunk_loop, loaded with ctypes (which releases the GIL for the
 * whole call, so threads decode at once). Also a thread that gathers rows while its
 * owner goes on (atari_zarr.storage.row_gather).
 *
 * The loop uses no Python API: c-blosc2's blosc2_decompress_ctx and crc32c's
 * crc32c_value are passed in as function pointers, taken from the libraries
 * python-blosc2 and google-crc32c ship, so nothing is linked at build time. The file
 * is also an (empty) extension module, so that importing every module of the package
 * imports it too.
 */
#include <Python.h>
#if !defined(_WIN32)
#include <pthread.h>
#include <sched.h>
#include <time.h>
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
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
    /* the caller checked the bytes lie in their map; a length that could not (negative,
     * or running past the end of the address space) is refused here all the same */
    if (len < 0 || (uintptr_t)len > UINTPTR_MAX - (uintptr_t)s) {
        return TOO_SHORT;
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
            /* a division, not (within + 1) * row_bytes, which a large row could overflow */
            if (row_bytes <= 0 || within[p] < 0 || within[p] >= (int64_t)destsize / row_bytes) {
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

#if !defined(_WIN32)
/* A gather: row i of out is row index[i] of src, for i < n; `claimed` rows of it have
 * been taken by a thread, `done` rows copied. */
typedef struct {
    const uint8_t *src;
    int64_t src_rows, row_bytes;
    const int64_t *index;
    int64_t n;
    uint8_t *out;
    int64_t claimed, done;
} gather_job;

static int64_t clipped(const gather_job *j, int64_t i) {
    int64_t r = j->index[i];
    return r < 0 ? 0 : r >= j->src_rows ? j->src_rows - 1 : r; /* numpy's mode='clip' */
}

/* Ask for the start of a row and for one line of each page it covers: the processor
 * finds the pages (a random row of a large slab is on pages no TLB holds) and starts
 * reading while the row before is copied. A row follows on from there by itself. */
static void prefetch_row(const uint8_t *row, int64_t row_bytes) {
    uintptr_t at = (uintptr_t)row, end = at + (uintptr_t)row_bytes;
    __builtin_prefetch(row, 0, 3);
    __builtin_prefetch(row + 64, 0, 3);
    for (uintptr_t page = (at | 4095) + 1; page < end; page += 4096) {
        __builtin_prefetch((const void *)page, 0, 3);
    }
}

static void gather_rows_of(const gather_job *j, int64_t a, int64_t b) {
    for (int64_t i = a; i < b; i++) {
        if (i + 1 < b) {
            prefetch_row(j->src + clipped(j, i + 1) * j->row_bytes, j->row_bytes);
        }
        memcpy(j->out + i * j->row_bytes, j->src + clipped(j, i) * j->row_bytes,
               (size_t)j->row_bytes);
    }
}

#define QUEUED 8
#define BLOCK_ROWS 32 /* rows a thread claims at once: 225 KB of Atari frames */

/*
 * A thread that gathers rows for its owner, one gather after another, while the owner
 * goes on: gathers are queued (at most QUEUED at once) and numbered from 1, and the
 * owner waits for a number. An owner that waits does not sleep while rows of what it
 * waits for are left: it copies them too, so both cores gather. Started by
 * atari_zarr_gatherer_new, stopped by atari_zarr_gatherer_free, which lets it finish
 * what is queued first. Only the process that started it may call these: in a process
 * forked from it the thread does not exist (and the lock may be held), so there the
 * gatherer is left alone.
 */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t queued, finished_one;
    pthread_t thread;
    gather_job queue[QUEUED];
    int64_t submitted, finished;
    int stop;
    int sleeping; /* the thread waits on `queued` */
    int waiters;  /* callers that wait on `finished_one` */
} gatherer;

/*
 * Waking a thread that sleeps costs the waker a system call (on the 2-core VMs of
 * docs/benchmarks/cores.md, about 100 us: more than a batch's planning). So nobody
 * sleeps while a short wait will do: the thread, out of work, looks again every
 * IDLE_POLL_NS for IDLE_NS before it sleeps (a stream submits a batch every few hundred
 * microseconds), and a caller waiting for rows another thread is copying yields for up
 * to SPIN_NS (a block is copied in tens of microseconds); only then does either sleep,
 * and only then is it signalled.
 */
#define IDLE_POLL_NS 20000L
#define IDLE_NS 2000000L
#define SPIN_NS 200000L

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* With the lock held: count the gathers all of whose rows are done, in order, as
 * finished, and wake the callers that sleep waiting for one. */
static void gather_finish(gatherer *g) {
    int finished = 0;
    while (g->finished < g->submitted &&
           g->queue[g->finished % QUEUED].done == g->queue[g->finished % QUEUED].n) {
        g->finished++;
        finished = 1;
    }
    if (finished && g->waiters) {
        pthread_cond_broadcast(&g->finished_one);
    }
}

/*
 * With the lock held: claim a block of rows of the oldest gather numbered below `upto`
 * that has rows unclaimed, copy them without the lock, and count them done. 0 where no
 * rows were left.
 */
static int gather_block(gatherer *g, int64_t upto) {
    for (int64_t k = g->finished; k < g->submitted && k < upto; k++) {
        gather_job *j = &g->queue[k % QUEUED];
        if (j->claimed < j->n) {
            int64_t a = j->claimed;
            int64_t b = a + BLOCK_ROWS < j->n ? a + BLOCK_ROWS : j->n;
            j->claimed = b;
            pthread_mutex_unlock(&g->lock);
            gather_rows_of(j, a, b);
            pthread_mutex_lock(&g->lock);
            j->done += b - a;
            gather_finish(g);
            return 1;
        }
    }
    return 0;
}

/* With the lock held: until gather `number` is finished, copy its rows and those of
 * the gathers before it, then wait for the blocks other threads are copying. */
static void gather_until(gatherer *g, int64_t number) {
    int64_t spin_from = 0;
    while (g->finished < number) {
        if (gather_block(g, number)) {
            spin_from = 0;
            continue;
        }
        if (spin_from == 0) {
            spin_from = now_ns();
        }
        if (now_ns() - spin_from < SPIN_NS) {
            pthread_mutex_unlock(&g->lock);
            sched_yield();
            pthread_mutex_lock(&g->lock);
            continue;
        }
        g->waiters++;
        pthread_cond_wait(&g->finished_one, &g->lock);
        g->waiters--;
    }
}

static void *gatherer_main(void *arg) {
    gatherer *g = (gatherer *)arg;
    pthread_mutex_lock(&g->lock);
    int64_t idle_from = 0;
    for (;;) {
        if (gather_block(g, INT64_MAX)) {
            idle_from = 0;
            continue;
        }
        if (g->stop && g->finished == g->submitted) {
            break; /* stopped, and nothing is left */
        }
        if (idle_from == 0) {
            idle_from = now_ns();
        }
        /* stopped, rows still being copied by a waiter: nobody would signal `queued`
         * once they are done, so look again rather than sleep */
        if (g->stop || now_ns() - idle_from < IDLE_NS) {
            struct timespec pause = {0, IDLE_POLL_NS};
            pthread_mutex_unlock(&g->lock);
            nanosleep(&pause, NULL);
            pthread_mutex_lock(&g->lock);
            continue;
        }
        g->sleeping = 1;
        pthread_cond_wait(&g->queued, &g->lock);
        g->sleeping = 0;
        idle_from = 0;
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

/* A gatherer and its thread; NULL where either cannot be had. */
EXPORT void *atari_zarr_gatherer_new(void) {
    gatherer *g = (gatherer *)calloc(1, sizeof(gatherer));
    if (g == NULL) {
        return NULL;
    }
    if (pthread_mutex_init(&g->lock, NULL) != 0) {
        free(g);
        return NULL;
    }
    pthread_cond_init(&g->queued, NULL);
    pthread_cond_init(&g->finished_one, NULL);
    if (pthread_create(&g->thread, NULL, gatherer_main, g) != 0) {
        pthread_cond_destroy(&g->queued);
        pthread_cond_destroy(&g->finished_one);
        pthread_mutex_destroy(&g->lock);
        free(g);
        return NULL;
    }
#if defined(__GLIBC__)
    pthread_setname_np(g->thread, "atari_zarr-rows"); /* as ps and top show it */
#endif
    return g;
}

/*
 * Queue the gather of rows index[0 .. n - 1] of src (src_rows rows, row_bytes each)
 * into out, copying rows of those queued first while QUEUED gathers are; its number,
 * for atari_zarr_gatherer_wait. Until that wait returns, the caller keeps src, index
 * and out alive, does not read out and does not write src. It takes the lock only
 * briefly, so it may be called holding the GIL (the gathering thread never takes it).
 */
EXPORT int64_t atari_zarr_gatherer_submit(void *handle, const uint8_t *src, int64_t src_rows,
                                          int64_t row_bytes, const int64_t *index, int64_t n,
                                          uint8_t *out) {
    gatherer *g = (gatherer *)handle;
    pthread_mutex_lock(&g->lock);
    if (g->submitted - g->finished >= QUEUED) {
        gather_until(g, g->submitted - QUEUED + 1);
    }
    gather_job *j = &g->queue[g->submitted % QUEUED];
    *j = (gather_job){src, src_rows, row_bytes, index, n, out, 0, 0};
    int64_t number = ++g->submitted;
    gather_finish(g); /* an empty gather is finished at once, in its turn */
    if (g->sleeping) {
        pthread_cond_signal(&g->queued);
    }
    pthread_mutex_unlock(&g->lock);
    return number;
}

/* Return once gather `number` (and every one before it) is done, copying rows of them
 * meanwhile where some are left. */
EXPORT void atari_zarr_gatherer_wait(void *handle, int64_t number) {
    gatherer *g = (gatherer *)handle;
    pthread_mutex_lock(&g->lock);
    gather_until(g, number);
    pthread_mutex_unlock(&g->lock);
}

/* Finish what is queued, stop the thread and free the gatherer. */
EXPORT void atari_zarr_gatherer_free(void *handle) {
    gatherer *g = (gatherer *)handle;
    pthread_mutex_lock(&g->lock);
    g->stop = 1;
    pthread_cond_signal(&g->queued); /* asleep, or soon to see `stop` */
    pthread_mutex_unlock(&g->lock);
    pthread_join(g->thread, NULL);
    pthread_cond_destroy(&g->queued);
    pthread_cond_destroy(&g->finished_one);
    pthread_mutex_destroy(&g->lock);
    free(g);
}
#else
EXPORT void *atari_zarr_gatherer_new(void) { return NULL; } /* the caller gathers itself */
#endif

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_chunk_loop",
    "The compiled chunk loop; atari_zarr.storage.chunk_loop calls it through ctypes.",
    0,
    NULL,
};

PyMODINIT_FUNC PyInit__chunk_loop(void) { return PyModule_Create(&module); }
