/*
 * A stand-in for the CUDA driver (libcuda) and NCCL (libnccl) with the calls lens-nccl makes
 * through cudarc, for tests on machines without a GPU. One shared object answers to both
 * names (libcuda.so and libnccl.so are links to it). Device memory is host memory; every
 * copy runs at once; an NCCL group lives inside one process (its ranks are threads), and a
 * broadcast completes only when every rank has queued it, so the deadline, abort and
 * ordering logic above it runs as on a GPU. Devices: $LENS_FAKE_GPU_DEVICES (default 2).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOT_READY 600
#define CUDA_ERROR_UNKNOWN 999
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_INVALID_DEVICE 101
#define NCCL_SYSTEM_ERROR 2
#define NCCL_INVALID_ARGUMENT 4
#define NCCL_INVALID_USAGE 5
#define MAX_RANKS 64
#define RING 64
#define WAIT_LIMIT_NS (30LL * 1000 * 1000 * 1000)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

struct op {
    uint64_t seq;
    int posted;
    int root;
    size_t bytes[MAX_RANKS];
    void *bufs[MAX_RANKS];
};

struct group {
    char id[128];
    int n;
    int joined;
    uint64_t completed; /* collectives complete in order: the highest done */
    struct op ops[RING];
    struct group *next;
};

struct stream {
    int device;
    struct group *g; /* the last collective queued on this stream */
    uint64_t seq;
};

struct event {
    struct group *g;
    uint64_t seq;
};

struct comm {
    struct group *g;
    int rank;
    int device;
    uint64_t seq;
    int aborted;
    struct stream *last_stream;
};

static struct group *groups;
static int contexts[MAX_RANKS];
static __thread void *current_ctx;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int device_count(void) {
    const char *v = getenv("LENS_FAKE_GPU_DEVICES");
    int n = v ? atoi(v) : 2;
    return n < 0 ? 0 : (n > MAX_RANKS ? MAX_RANKS : n);
}

/* Whether the collective `seq` of `g` is done; call with the lock held. */
static int done(struct group *g, uint64_t seq) { return g == NULL || g->completed >= seq; }

/* Waits (bounded) for a stream's queued collective, as a blocking CUDA call would. */
static int wait_stream(struct stream *s) {
    int64_t start = now_ns();
    for (;;) {
        pthread_mutex_lock(&lock);
        int ok = s == NULL || done(s->g, s->seq);
        pthread_mutex_unlock(&lock);
        if (ok) return 0;
        if (now_ns() - start > WAIT_LIMIT_NS) return CUDA_ERROR_UNKNOWN;
        usleep(50);
    }
}

/* ---- CUDA driver ---- */

int cuInit(unsigned flags) { (void)flags; return 0; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuDeviceGetCount(int *n) { *n = device_count(); return 0; }

int cuDeviceGet(int *dev, int ordinal) {
    if (ordinal < 0 || ordinal >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return 0;
}

/* Memory pools supported (as on current GPUs), so cudarc allocates and frees on the stream. */
#define ATTR_MEMORY_POOLS_SUPPORTED 115
int cuDeviceGetAttribute(int *v, int attr, int dev) {
    (void)dev;
    *v = attr == ATTR_MEMORY_POOLS_SUPPORTED;
    return 0;
}

int cuDeviceGetName(char *name, int len, int dev) {
    (void)dev;
    strncpy(name, "lens fake GPU", (size_t)len);
    return 0;
}

int cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
    contexts[dev] = dev;
    *ctx = &contexts[dev];
    return 0;
}

int cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return 0; }
int cuCtxCreate_v2(void **ctx, unsigned flags, int dev) { (void)flags; return cuDevicePrimaryCtxRetain(ctx, dev); }
int cuCtxGetCurrent(void **ctx) { *ctx = current_ctx; return 0; }
int cuCtxSetCurrent(void *ctx) { current_ctx = ctx; return 0; }
int cuCtxPushCurrent_v2(void *ctx) { current_ctx = ctx; return 0; }
int cuCtxPopCurrent_v2(void **ctx) { if (ctx) *ctx = current_ctx; return 0; }
int cuCtxSynchronize(void) { return 0; }

int cuCtxGetDevice(int *dev) {
    if (current_ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    *dev = *(int *)current_ctx;
    return 0;
}

int cuStreamCreate(void **s, unsigned flags) {
    (void)flags;
    struct stream *st = calloc(1, sizeof *st);
    if (st == NULL) return CUDA_ERROR_UNKNOWN;
    st->device = current_ctx ? *(int *)current_ctx : 0;
    *s = st;
    return 0;
}

/* Streams are kept: an aborted communicator may still name its last one. */
int cuStreamDestroy_v2(void *s) { (void)s; return 0; }

int cuStreamSynchronize(void *s) { return wait_stream(s); }
int cuStreamWaitEvent(void *s, void *e, unsigned flags) { (void)s; (void)e; (void)flags; return 0; }

int cuStreamQuery(void *s) {
    struct stream *st = s;
    pthread_mutex_lock(&lock);
    int ok = st == NULL || done(st->g, st->seq);
    pthread_mutex_unlock(&lock);
    return ok ? 0 : NOT_READY;
}

int cuEventCreate(void **e, unsigned flags) {
    (void)flags;
    struct event *ev = calloc(1, sizeof *ev);
    if (ev == NULL) return CUDA_ERROR_UNKNOWN;
    *e = ev;
    return 0;
}

int cuEventDestroy_v2(void *e) { free(e); return 0; }

int cuEventRecord(void *e, void *s) {
    struct event *ev = e;
    struct stream *st = s;
    pthread_mutex_lock(&lock);
    ev->g = st ? st->g : NULL;
    ev->seq = st ? st->seq : 0;
    pthread_mutex_unlock(&lock);
    return 0;
}

int cuEventRecordWithFlags(void *e, void *s, unsigned flags) { (void)flags; return cuEventRecord(e, s); }

int cuEventQuery(void *e) {
    struct event *ev = e;
    pthread_mutex_lock(&lock);
    int ok = done(ev->g, ev->seq);
    pthread_mutex_unlock(&lock);
    return ok ? 0 : NOT_READY;
}

int cuEventSynchronize(void *e) {
    int64_t start = now_ns();
    while (cuEventQuery(e) == NOT_READY) {
        if (now_ns() - start > WAIT_LIMIT_NS) return CUDA_ERROR_UNKNOWN;
        usleep(50);
    }
    return 0;
}

int cuMemAlloc_v2(uint64_t *p, size_t n) {
    void *m = malloc(n ? n : 1);
    if (m == NULL) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    *p = (uint64_t)(uintptr_t)m;
    return 0;
}

int cuMemAllocAsync(uint64_t *p, size_t n, void *s) { (void)s; return cuMemAlloc_v2(p, n); }
int cuMemFree_v2(uint64_t p) { free((void *)(uintptr_t)p); return 0; }
int cuMemFreeAsync(uint64_t p, void *s) { (void)s; return cuMemFree_v2(p); }

int cuMemsetD8Async(uint64_t p, unsigned char v, size_t n, void *s) {
    (void)s;
    memset((void *)(uintptr_t)p, v, n);
    return 0;
}

int cuMemsetD8_v2(uint64_t p, unsigned char v, size_t n) { return cuMemsetD8Async(p, v, n, NULL); }

int cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t n, void *s) {
    /* Stream order: after the queued collective (lens never uploads while one is queued). */
    int r = wait_stream(s);
    if (r) return r;
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}

int cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t n, void *s) {
    int r = wait_stream(s);
    if (r) return r;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return 0;
}

int cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t n) { return cuMemcpyHtoDAsync_v2(dst, src, n, NULL); }
int cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n) { return cuMemcpyDtoHAsync_v2(dst, src, n, NULL); }

int cuGetErrorString(int r, const char **s) { (void)r; *s = "lens fake GPU error"; return 0; }
int cuGetErrorName(int r, const char **s) { (void)r; *s = "LENS_FAKE_GPU_ERROR"; return 0; }

/* ---- NCCL ---- */

typedef struct { char internal[128]; } ncclUniqueId;

int ncclGetVersion(int *v) { *v = 22800; return 0; }
const char *ncclGetErrorString(int r) { (void)r; return "lens fake NCCL error"; }
const char *ncclGetLastError(void *comm) { (void)comm; return ""; }

int ncclGetUniqueId(ncclUniqueId *id) {
    static uint64_t counter;
    memset(id, 0, sizeof *id);
    pthread_mutex_lock(&lock);
    uint64_t c = ++counter;
    pthread_mutex_unlock(&lock);
    uint64_t words[3] = {(uint64_t)getpid(), c, (uint64_t)now_ns()};
    memcpy(id->internal, "lensfake", 8);
    memcpy(id->internal + 8, words, sizeof words);
    return 0;
}

static struct comm *new_comm(struct group *g, int rank, int device) {
    struct comm *c = calloc(1, sizeof *c);
    if (c) { c->g = g; c->rank = rank; c->device = device; }
    return c;
}

int ncclCommInitRank(void **comm, int n, ncclUniqueId id, int rank) {
    if (n < 1 || n > MAX_RANKS || rank < 0 || rank >= n) return NCCL_INVALID_ARGUMENT;
    if (current_ctx == NULL) return NCCL_INVALID_USAGE; /* NCCL needs a current device */
    pthread_mutex_lock(&lock);
    struct group *g = groups;
    while (g && memcmp(g->id, id.internal, sizeof g->id) != 0) g = g->next;
    if (g == NULL) {
        g = calloc(1, sizeof *g);
        if (g == NULL) { pthread_mutex_unlock(&lock); return NCCL_SYSTEM_ERROR; }
        memcpy(g->id, id.internal, sizeof g->id);
        g->n = n;
        g->next = groups;
        groups = g;
    }
    int mismatch = g->n != n;
    if (!mismatch) g->joined++;
    pthread_mutex_unlock(&lock);
    if (mismatch) return NCCL_INVALID_ARGUMENT;
    /* Like NCCL: wait for every rank (bounded here so a broken test still ends). */
    int64_t start = now_ns();
    for (;;) {
        pthread_mutex_lock(&lock);
        int all = g->joined >= g->n;
        pthread_mutex_unlock(&lock);
        if (all) break;
        if (now_ns() - start > 2 * WAIT_LIMIT_NS) return NCCL_SYSTEM_ERROR;
        usleep(200);
    }
    *comm = new_comm(g, rank, *(int *)current_ctx);
    return *comm ? 0 : NCCL_SYSTEM_ERROR;
}

int ncclCommInitAll(void **comms, int n, const int *devs) {
    if (n < 1 || n > MAX_RANKS) return NCCL_INVALID_ARGUMENT;
    struct group *g = calloc(1, sizeof *g);
    if (g == NULL) return NCCL_SYSTEM_ERROR;
    g->n = n;
    g->joined = n;
    pthread_mutex_lock(&lock);
    g->next = groups;
    groups = g;
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < n; i++) comms[i] = new_comm(g, i, devs ? devs[i] : i);
    return 0;
}

static size_t type_size(int t) {
    static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
    return t >= 0 && t < (int)(sizeof sizes / sizeof sizes[0]) ? sizes[t] : 0;
}

int ncclBroadcast(const void *send, void *recv, size_t count, int type, int root, void *comm, void *stream) {
    struct comm *c = comm;
    struct stream *s = stream;
    size_t bytes = count * type_size(type);
    if (c == NULL || s == NULL || type_size(type) == 0) return NCCL_INVALID_ARGUMENT;
    if (root < 0 || root >= c->g->n) return NCCL_INVALID_ARGUMENT;
    if (current_ctx == NULL || *(int *)current_ctx != s->device) return NCCL_INVALID_USAGE;
    if (c->aborted) return NCCL_INVALID_USAGE;
    if (c->rank == root && send != recv) memcpy(recv, send, bytes);
    pthread_mutex_lock(&lock);
    struct group *g = c->g;
    uint64_t seq = ++c->seq;
    struct op *o = &g->ops[seq % RING];
    if (o->seq != seq) {
        memset(o, 0, sizeof *o);
        o->seq = seq;
    }
    o->bufs[c->rank] = recv;
    o->bytes[c->rank] = bytes;
    if (c->rank == root) o->root = root;
    o->posted++;
    if (o->posted == g->n) {
        /* Ranks that disagree on the size get what fits (real NCCL would misbehave). */
        for (int r = 0; r < g->n; r++) {
            size_t n = o->bytes[r] < o->bytes[o->root] ? o->bytes[r] : o->bytes[o->root];
            if (r != o->root && o->bufs[r]) memcpy(o->bufs[r], o->bufs[o->root], n);
        }
        g->completed = seq;
    }
    s->g = g;
    s->seq = seq;
    c->last_stream = s;
    pthread_mutex_unlock(&lock);
    return 0;
}

int ncclCommAbort(void *comm) {
    struct comm *c = comm;
    if (c == NULL) return 0;
    pthread_mutex_lock(&lock);
    c->aborted = 1;
    /* Its kernels are gone: nothing on its stream waits for the peers any more. */
    if (c->last_stream) c->last_stream->g = NULL;
    pthread_mutex_unlock(&lock);
    return 0;
}

int ncclCommCount(void *comm, int *n) {
    struct comm *c = comm;
    if (c == NULL || c->aborted) return NCCL_INVALID_ARGUMENT;
    *n = c->g->n;
    return 0;
}

int ncclCommUserRank(void *comm, int *rank) {
    struct comm *c = comm;
    if (c == NULL || c->aborted) return NCCL_INVALID_ARGUMENT;
    *rank = c->rank;
    return 0;
}

int ncclCommCuDevice(void *comm, int *device) {
    struct comm *c = comm;
    if (c == NULL || c->aborted) return NCCL_INVALID_ARGUMENT;
    *device = c->device;
    return 0;
}

int ncclCommDestroy(void *comm) { return ncclCommAbort(comm); }
int ncclCommFinalize(void *comm) { (void)comm; return 0; }
int ncclGroupStart(void) { return 0; }
int ncclGroupEnd(void) { return 0; }
