/*
 * A stand-in for the CUDA driver (libcuda) and NCCL (libnccl) with the calls lens-nccl makes
 * through cudarc, and for NVML (libnvidia-ml) with the calls lens-otlp makes, for tests on
 * machines without a GPU. One shared object answers to every name (libcuda.so, libnccl.so
 * and libnvidia-ml.so.1 are links to it). Device memory is host memory and copies
 * run at once. An NCCL group lives in shared memory, so its ranks may be threads of one
 * process or separate processes; a broadcast completes only when every rank has queued it,
 * and a rank's buffer receives the root's bytes when that rank next looks at its stream, so
 * the deadline, abort and ordering logic above it runs as on a GPU.
 * Devices: $LENS_FAKE_GPU_DEVICES (default 2).
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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
/* Ranks are at most one collective apart, so a few slots suffice. */
#define RING 4
/* The largest broadcast: lens's payload limit (64 KiB) plus room. */
#define SLOT (96 * 1024)
#define MAGIC 0x6c656e73u
#define WAIT_LIMIT_NS (30LL * 1000 * 1000 * 1000)

/* ---- the group, in memory shared by its ranks ---- */

struct op {
    uint64_t seq;
    int posted;
    int gather; /* an all-gather: every rank receives everything */
    int root;
    size_t bytes;
    unsigned char data[SLOT];
};

struct group {
    volatile uint32_t magic; /* set last by the creator: the rest is ready */
    pthread_mutex_t mu;      /* process-shared */
    int n;
    int joined;
    uint64_t completed; /* collectives complete in order: the highest done */
    struct op ops[RING];
};

struct comm {
    struct group *g;
    int rank;
    int device;
    uint64_t seq;
    int aborted;
};

/* A collective queued on a stream, and where its result goes. */
struct pending {
    struct comm *c;
    uint64_t seq;
    void *recv;
    size_t bytes;
};

/* A stream runs its queued collectives in order. */
#define QUEUE 8
struct stream {
    int device;
    struct pending q[QUEUE];
    int head, count;
    uint64_t queued; /* collectives queued on this stream so far */
};

struct event {
    struct stream *s;
    uint64_t upto; /* done once the stream has run this many collectives */
};

static pthread_mutex_t local = PTHREAD_MUTEX_INITIALIZER;
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

static void group_init(struct group *g, int n) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&g->mu, &a);
    pthread_mutexattr_destroy(&a);
    g->n = n;
    __atomic_store_n(&g->magic, MAGIC, __ATOMIC_RELEASE);
}

/*
 * Runs the stream's queued collectives that are complete, in order, putting each result in
 * place. Returns how many collectives the stream has finished in all.
 */
static uint64_t stream_run(struct stream *s) {
    while (s->count > 0) {
        struct pending *p = &s->q[s->head];
        struct comm *c = p->c;
        if (!c->aborted) { /* an aborted communicator's kernels are gone */
            struct group *g = c->g;
            pthread_mutex_lock(&g->mu);
            int complete = g->completed >= p->seq;
            if (complete && p->recv) {
                struct op *o = &g->ops[p->seq % RING];
                if (o->seq == p->seq && (o->gather || c->rank != o->root)) {
                    size_t n = p->bytes < o->bytes ? p->bytes : o->bytes;
                    memcpy(p->recv, o->data, n);
                }
            }
            pthread_mutex_unlock(&g->mu);
            if (!complete) break;
        }
        s->head = (s->head + 1) % QUEUE;
        s->count--;
    }
    return s->queued - (uint64_t)s->count;
}

static int stream_done(struct stream *s) { return s == NULL || (stream_run(s), s->count == 0); }

/* Waits (bounded) for a stream's queued collective, as a blocking CUDA call would. */
static int wait_stream(struct stream *s) {
    int64_t start = now_ns();
    while (!stream_done(s)) {
        if (now_ns() - start > WAIT_LIMIT_NS) return CUDA_ERROR_UNKNOWN;
        usleep(50);
    }
    return 0;
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
int cuStreamQuery(void *s) { return stream_done(s) ? 0 : NOT_READY; }

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
    ev->s = s;
    ev->upto = s ? ev->s->queued : 0;
    return 0;
}

int cuEventRecordWithFlags(void *e, void *s, unsigned flags) { (void)flags; return cuEventRecord(e, s); }

int cuEventQuery(void *e) {
    struct event *ev = e;
    if (ev->s == NULL) return 0;
    return stream_run(ev->s) >= ev->upto ? 0 : NOT_READY;
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

int cuMemFreeAsync(uint64_t p, void *s) {
    /* Stream order: memory freed while a queued collective still targets it is kept (its
       result is dropped), as the free would wait on a GPU. */
    struct stream *st = s;
    for (int i = 0; st && i < st->count; i++) {
        struct pending *q = &st->q[(st->head + i) % QUEUE];
        if ((uint64_t)(uintptr_t)q->recv == p) {
            q->recv = NULL;
            return 0;
        }
    }
    return cuMemFree_v2(p);
}

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
    pthread_mutex_lock(&local);
    uint64_t c = ++counter;
    pthread_mutex_unlock(&local);
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

/* The group's file, named by the id: in $LENS_FAKE_GPU_DIR (removed with the fake), else
   /dev/shm, else /tmp. */
static void group_path(const ncclUniqueId *id, char *out, size_t len) {
    const char *dir = getenv("LENS_FAKE_GPU_DIR");
    if (dir == NULL || *dir == 0) dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    uint64_t w[3];
    memcpy(w, id->internal + 8, sizeof w);
    snprintf(out, len, "%s/lens-fake-nccl-%llx-%llx-%llx", dir, (unsigned long long)w[0],
             (unsigned long long)w[1], (unsigned long long)w[2]);
}

/* Opens (or creates) the group of `id` shared by every rank that joins it. */
static struct group *open_group(const ncclUniqueId *id, int n) {
    char path[256];
    group_path(id, path, sizeof path);
    int creator = 1;
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        creator = 0;
        fd = open(path, O_RDWR);
    }
    if (fd < 0) return NULL;
    if (creator && ftruncate(fd, sizeof(struct group)) != 0) {
        close(fd);
        return NULL;
    }
    /* A joiner may arrive before the creator sized the file. */
    int64_t start = now_ns();
    while (!creator && lseek(fd, 0, SEEK_END) < (off_t)sizeof(struct group)) {
        if (now_ns() - start > WAIT_LIMIT_NS) { close(fd); return NULL; }
        usleep(200);
    }
    struct group *g = mmap(NULL, sizeof *g, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (g == MAP_FAILED) return NULL;
    if (creator) {
        group_init(g, n);
    } else {
        while (__atomic_load_n(&g->magic, __ATOMIC_ACQUIRE) != MAGIC) {
            if (now_ns() - start > WAIT_LIMIT_NS) return NULL;
            usleep(200);
        }
    }
    return g;
}

int ncclCommInitRank(void **comm, int n, ncclUniqueId id, int rank) {
    if (n < 1 || n > MAX_RANKS || rank < 0 || rank >= n) return NCCL_INVALID_ARGUMENT;
    if (current_ctx == NULL) return NCCL_INVALID_USAGE; /* NCCL needs a current device */
    struct group *g = open_group(&id, n);
    if (g == NULL) return NCCL_SYSTEM_ERROR;
    pthread_mutex_lock(&g->mu);
    int mismatch = g->n != n;
    int all = 0;
    if (!mismatch) all = ++g->joined == g->n;
    pthread_mutex_unlock(&g->mu);
    if (mismatch) return NCCL_INVALID_ARGUMENT;
    if (all) {
        /* The last to join removes the name; the ranks keep their mappings. */
        char path[256];
        group_path(&id, path, sizeof path);
        unlink(path);
    }
    /* Like NCCL: wait for every rank (bounded here so a broken test still ends). */
    int64_t start = now_ns();
    for (;;) {
        pthread_mutex_lock(&g->mu);
        all = g->joined >= g->n;
        pthread_mutex_unlock(&g->mu);
        if (all) break;
        if (now_ns() - start > 2 * WAIT_LIMIT_NS) return NCCL_SYSTEM_ERROR;
        usleep(200);
    }
    *comm = new_comm(g, rank, *(int *)current_ctx);
    return *comm ? 0 : NCCL_SYSTEM_ERROR;
}

int ncclCommInitAll(void **comms, int n, const int *devs) {
    if (n < 1 || n > MAX_RANKS) return NCCL_INVALID_ARGUMENT;
    struct group *g = mmap(NULL, sizeof *g, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g == MAP_FAILED) return NCCL_SYSTEM_ERROR;
    group_init(g, n);
    g->joined = n;
    for (int i = 0; i < n; i++) comms[i] = new_comm(g, i, devs ? devs[i] : i);
    return 0;
}

static size_t type_size(int t) {
    static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
    return t >= 0 && t < (int)(sizeof sizes / sizeof sizes[0]) ? sizes[t] : 0;
}

/*
 * Takes this rank's next collective slot of the group, fresh when no rank has posted to it
 * yet, with the group's lock held (the caller fills it, then calls posted()).
 */
static struct op *take_op(struct comm *c, int gather, size_t bytes, uint64_t *seq) {
    struct group *g = c->g;
    pthread_mutex_lock(&g->mu);
    *seq = ++c->seq;
    struct op *o = &g->ops[*seq % RING];
    if (o->seq != *seq) {
        o->seq = *seq;
        o->posted = 0;
        o->gather = gather;
        o->root = -1;
        o->bytes = bytes;
    }
    return o;
}

/* Counts this rank's post, releases the lock, and queues the result for `recv` on `s`. */
static int posted(struct comm *c, struct op *o, uint64_t seq, struct stream *s, void *recv, size_t bytes) {
    struct group *g = c->g;
    if (++o->posted == g->n) g->completed = seq;
    pthread_mutex_unlock(&g->mu);
    struct pending *q = &s->q[(s->head + s->count) % QUEUE];
    q->c = c;
    q->seq = seq;
    q->recv = recv;
    q->bytes = bytes;
    s->count++;
    s->queued++;
    return 0;
}

/* What every collective checks first: arguments, the current device, the queue. */
static int check_call(struct comm *c, struct stream *s, size_t bytes) {
    if (c == NULL || s == NULL || bytes > SLOT) return NCCL_INVALID_ARGUMENT;
    if (current_ctx == NULL || *(int *)current_ctx != s->device) return NCCL_INVALID_USAGE;
    if (c->aborted) return NCCL_INVALID_USAGE;
    if (s->count == QUEUE) return NCCL_SYSTEM_ERROR; /* the fake's queue is short */
    return 0;
}

int ncclBroadcast(const void *send, void *recv, size_t count, int type, int root, void *comm, void *stream) {
    struct comm *c = comm;
    struct stream *s = stream;
    size_t bytes = count * type_size(type);
    if (type_size(type) == 0) return NCCL_INVALID_ARGUMENT;
    int bad = check_call(c, s, bytes);
    if (bad) return bad;
    if (root < 0 || root >= c->g->n) return NCCL_INVALID_ARGUMENT;
    uint64_t seq;
    struct op *o = take_op(c, 0, 0, &seq);
    if (c->rank == root) {
        memcpy(o->data, send, bytes);
        if (send != recv) memcpy(recv, send, bytes);
        o->root = root;
        o->bytes = bytes;
    }
    return posted(c, o, seq, s, recv, bytes);
}

/* Each rank's `count` elements land at its place in every rank's `recv`, in rank order. */
int ncclAllGather(const void *send, void *recv, size_t count, int type, void *comm, void *stream) {
    struct comm *c = comm;
    struct stream *s = stream;
    size_t each = count * type_size(type);
    if (type_size(type) == 0 || c == NULL) return NCCL_INVALID_ARGUMENT;
    size_t all = each * (size_t)c->g->n;
    int bad = check_call(c, s, all);
    if (bad) return bad;
    uint64_t seq;
    struct op *o = take_op(c, 1, all, &seq);
    memcpy(o->data + each * (size_t)c->rank, send, each);
    return posted(c, o, seq, s, recv, all);
}

int ncclCommAbort(void *comm) {
    struct comm *c = comm;
    if (c == NULL) return 0;
    /* Its kernels are gone: nothing on its stream waits for the peers any more. */
    c->aborted = 1;
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

/* ---- NVML (libnvidia-ml.so.1): what lens-otlp reads for a rank's resource ---- */

#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7

static int nvml_inits;

int nvmlInit_v2(void) { nvml_inits++; return 0; }
int nvmlShutdown(void) { nvml_inits--; return 0; }

/* A device handle is its index plus one (never null). */
int nvmlDeviceGetHandleByIndex_v2(unsigned index, void **device) {
    if (nvml_inits <= 0 || (int)index >= device_count()) return NVML_ERROR_INVALID_ARGUMENT;
    *device = (void *)(uintptr_t)(index + 1);
    return 0;
}

static void fake_uuid(char *out, size_t len, unsigned index) {
    snprintf(out, len, "GPU-1e45fa4e-0000-4000-8000-%012u", index);
}

int nvmlDeviceGetHandleByUUID(const char *uuid, void **device) {
    char want[96];
    for (int i = 0; i < device_count(); i++) {
        fake_uuid(want, sizeof want, (unsigned)i);
        if (strcmp(uuid, want) == 0) { *device = (void *)(uintptr_t)(i + 1); return 0; }
    }
    return NVML_ERROR_NOT_FOUND;
}

static int nvml_text(char *out, unsigned len, const char *text) {
    if (strlen(text) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return 0;
}

int nvmlDeviceGetUUID(void *device, char *out, unsigned len) {
    char uuid[96];
    fake_uuid(uuid, sizeof uuid, (unsigned)((uintptr_t)device - 1));
    return nvml_text(out, len, uuid);
}

int nvmlDeviceGetName(void *device, char *out, unsigned len) {
    (void)device;
    return nvml_text(out, len, "lens fake GPU");
}

int nvmlDeviceGetIndex(void *device, unsigned *index) {
    *index = (unsigned)((uintptr_t)device - 1);
    return 0;
}

int nvmlSystemGetDriverVersion(char *out, unsigned len) { return nvml_text(out, len, "999.99-fake"); }
